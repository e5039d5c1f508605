"""The qwen2_moe family against mlx-lm, from tiny checkpoints mlx-lm writes
and loads itself: logits, greedy tokens, batches and prompt caches with the
shared expert and its sigmoid gate; the experts' per-expert, quantized and
GGUF (``*_shexp``, ``ffn_gate_inp_shexp``) layouts; configs it refuses."""

from __future__ import annotations

import pytest
from family_checks import (TINY_CONFIG, MlxLmParity, MoEChecks,
                           check_two_ranks_generate_as_one_process, load_tiny, write_checkpoint)

from mlxprog.llm import ModelError
from mlxprog.llm.hf import config_from_hf

QWEN2_MOE = dict(TINY_CONFIG, model_type="qwen2_moe", rope_theta=1e6, num_experts=8,
                 num_experts_per_tok=2, moe_intermediate_size=64,
                 shared_expert_intermediate_size=96)
CONFIGS = {
    "qwen2_moe": QWEN2_MOE,
    # (mlx-lm's Qwen2-MoE has an lm_head whatever tie_word_embeddings says,
    # so tied embeddings are not compared here; no released model ties them.)
    "qwen2_moe-top3": dict(QWEN2_MOE, num_experts_per_tok=3),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp(request.param), CONFIGS[request.param])


class TestMlxLmParity(MlxLmParity):
    """Logits, greedy tokens, batches and prompt caches against mlx-lm."""


class TestExperts(MoEChecks):
    """The experts' layouts: per expert, quantized, GGUF."""


def test_shared_expert_and_biases_are_read(checkpoint, tmp_path):
    from gguf_writer import write_gguf_from_hf

    llm = load_tiny(checkpoint)
    c = llm.config
    assert (c.shared_expert_intermediate_size, c.attention_bias, c.renormalize) == (
        96, True, False)
    assert llm.checkpoint.weights["layers.1.mlp.shared_expert_gate.weight"].shape == (1, 64)
    gguf = load_tiny(write_gguf_from_hf(checkpoint, tmp_path / "model.gguf"))
    names = set(gguf.checkpoint.source_names.values())
    assert {"blk.0.ffn_gate_inp_shexp.weight", "blk.0.ffn_down_shexp.weight"} <= names
    assert gguf.config.shared_expert_intermediate_size == 96


@pytest.mark.parametrize("changes, message", [
    (dict(shared_expert_intermediate_size=None),
     "config.json lacks 'shared_expert_intermediate_size'"),
    (dict(num_experts_per_tok=12), "num_experts_per_tok 12 is more than the 8 experts"),
    (dict(use_sliding_window=True, sliding_window=16), "sliding_window 16"),
])
def test_bad_configs_name_the_key(changes, message):
    with pytest.raises(ModelError, match=message):
        config_from_hf(dict(QWEN2_MOE, **changes))


def test_two_ranks_split_the_experts_and_keep_the_shared_one_whole(tmp_path):
    check_two_ranks_generate_as_one_process(write_checkpoint(tmp_path / "ckpt", QWEN2_MOE))
