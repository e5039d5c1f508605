"""The qwen3 family against mlx-lm, from tiny checkpoints mlx-lm writes and
loads itself: logits, greedy tokens, batches and prompt caches; configs it
refuses; a missing weight; the GGUF file llama.cpp's converter would write;
two tensor-parallel ranks against one."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from family_checks import (MlxLmParity, MAX_LENGTH, PROMPT_IDS, TINY_CONFIG, load_tiny,
                           program_logits, write_checkpoint)

from mlxprog.llm import ModelError, load
from mlxprog.llm.hf import config_from_hf

QWEN3 = dict(TINY_CONFIG, model_type="qwen3", rope_theta=1e6, use_sliding_window=False,
             sliding_window=32, hidden_act="silu")
#: head_dim differs from hidden_size / num_attention_heads (16) in both.
CONFIGS = {
    "qwen3": dict(QWEN3, head_dim=32),
    "qwen3-tied": dict(QWEN3, head_dim=8, tie_word_embeddings=True),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp(request.param), CONFIGS[request.param])


class TestMlxLmParity(MlxLmParity):
    """Logits, greedy tokens, batches and prompt caches against mlx-lm, for
    every config."""


def test_gguf_gives_the_checkpoints_logits(checkpoint, tmp_path):
    """The GGUF file of the checkpoint (llama.cpp's names, half-split RoPE,
    ``key_length`` for the explicit head_dim) gives the directory's logits."""
    from gguf_writer import write_gguf_from_hf

    gguf = load_tiny(write_gguf_from_hf(checkpoint, tmp_path / "model.gguf"))
    hf = load_tiny(checkpoint)
    assert gguf.config.head_dim == hf.config.head_dim != 64 // 4
    assert "blk.0.attn_q_norm.weight" in gguf.checkpoint.source_names.values()
    continuation = [5, 60, 7]
    np.testing.assert_allclose(program_logits(gguf, PROMPT_IDS, continuation),
                               program_logits(hf, PROMPT_IDS, continuation),
                               rtol=1e-5, atol=1e-5)


def test_head_norms_are_per_layer_replicated_weights(checkpoint):
    llm = load_tiny(checkpoint)
    c = llm.config
    assert (c.family, c.rope_traditional, c.attention_bias) == ("qwen3", False, False)
    assert llm.checkpoint.weights["layers.2.self_attn.k_norm.weight"].shape == (c.head_dim,)
    assert "layers.0.self_attn.q_norm" not in llm.spec.splits


@pytest.mark.parametrize("changes, message", [
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
     "rope_scaling type 'yarn' is not supported by the qwen3 family (supported: default, "
     "linear)"),
    (dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported by the qwen3 family"),
    (dict(num_attention_heads=6, num_key_value_heads=4),
     "num_attention_heads 6 is not a multiple of num_key_value_heads 4"),
    (dict(attention_bias=True), "attention_bias = True is not supported by the qwen3 family"),
    (dict(use_sliding_window=True),
     "sliding_window 32 (< max_position_embeddings 512) is not supported by the qwen3 family"),
])
def test_unsupported_configs_name_the_field(changes, message):
    with pytest.raises(ModelError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config_from_hf(dict(CONFIGS["qwen3"], **changes))


def test_an_unused_sliding_window_is_accepted():
    # use_sliding_window is off: the window Qwen3 configs name does not apply.
    assert config_from_hf(CONFIGS["qwen3"]).context_length == 512


def test_a_missing_weight_names_it_and_the_directory(tmp_path):
    directory = write_checkpoint(tmp_path / "ckpt", CONFIGS["qwen3"])
    weights = mx.load(str(directory / "model.safetensors"))
    del weights["model.layers.1.self_attn.k_norm.weight"]
    mx.save_safetensors(str(directory / "model.safetensors"), weights)
    with pytest.raises(ModelError, match=f"{directory}: missing weight\\(s\\) "
                       "model.layers.1.self_attn.k_norm.weight that the qwen3 config needs"):
        load(directory)


# -- tensor parallelism ----------------------------------------------------------
RANK_SCRIPT = """
import json
import mlx.core as mx
from mlxprog.llm import load

llm = load({path!r}, max_length={max_length}, group=mx.distributed.init(), numerics="exact")
out = llm.generate({prompt!r}, max_tokens=16, chat=False, logprobs=True)
print(json.dumps([llm.rank, llm.world_size, out.tokens, out.logprobs]), flush=True)
"""


def test_two_ranks_with_uneven_heads_generate_as_one_process(tmp_path):
    """3 KV heads (6 query heads of an explicit head_dim) split 2 and 1: the
    same greedy tokens and nearly the same log-probabilities on both ranks
    as in one process."""
    from distributed_helpers import run_ranks

    path = write_checkpoint(tmp_path / "uneven", dict(
        CONFIGS["qwen3"], num_attention_heads=6, num_key_value_heads=3, head_dim=16))
    want = load(path, max_length=MAX_LENGTH, numerics="exact").generate(
        PROMPT_IDS, max_tokens=16, chat=False, logprobs=True)
    script = RANK_SCRIPT.format(path=str(path), max_length=MAX_LENGTH, prompt=PROMPT_IDS)
    results = run_ranks(script, 2, timeout=120)
    for r in results:
        assert r.returncode == 0, f"rank {r.rank} (status {r.returncode}):\n{r.stderr}"
        rank, world_size, tokens, logprobs = json.loads(r.stdout.splitlines()[-1])
        assert (rank, world_size) == (r.rank, 2)
        assert tokens == want.tokens
        assert all(abs(a - b) < 1e-4 for a, b in zip(logprobs, want.logprobs, strict=True))
