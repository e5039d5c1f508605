"""The gemma3_text family against mlx-lm, from tiny checkpoints mlx-lm
writes and loads itself.

mlx-lm's Gemma 3 implements the sliding window (rotating caches, windowed
masks), so its own forward pass and generation are the reference, with a
window of 8 under the 40-token prompt and every third layer global (pattern
3 over 4 layers: sliding, sliding, global, sliding).
"""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import pytest
from family_checks import MlxLmParity, TINY_CONFIG, write_checkpoint

from mlxprog.llm import ModelError
from mlxprog.llm.hf import config_from_hf
from mlxprog.llm.models import family_for_gguf
from mlxprog.llm.models.base import GGUFMetadata

#: hidden_size 96: sqrt(96) is not a bfloat16 value, so the embedding
#: scale's rounding shows; query_pre_attn_scalar differs from head_dim; the
#: local and global RoPE bases and the global layers' linear scaling differ.
GEMMA3 = dict(TINY_CONFIG, model_type="gemma3_text", hidden_size=96, num_hidden_layers=4,
              sliding_window=8, sliding_window_pattern=3, query_pre_attn_scalar=24,
              rope_theta=1e6, rope_local_base_freq=1e4,
              rope_scaling={"rope_type": "linear", "factor": 4.0})
#: Tied: mlx-lm ties Gemma 3's head when the checkpoint has no lm_head.
TIED = dict(GEMMA3, tie_word_embeddings=True, sliding_window_pattern=2, rope_scaling=None)
CONFIGS = {"gemma3": GEMMA3, "gemma3-tied": TIED}


def write(directory, config):
    """The tiny checkpoint, without lm_head where the config ties it."""
    directory = write_checkpoint(directory, config)
    if config.get("tie_word_embeddings"):
        path = str(directory / "model.safetensors")
        weights = mx.load(path)
        del weights["lm_head.weight"]
        mx.save_safetensors(path, weights)
    return directory


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    return write(tmp_path_factory.mktemp(request.param), CONFIGS[request.param])


class TestMlxLmParity(MlxLmParity):
    """Logits, greedy tokens, batches and prompt caches against mlx-lm, for
    every config."""


def test_config_reads_gemma3_settings():
    c = config_from_hf(GEMMA3)
    assert (c.family, c.query_scale, c.attn_softcap, c.final_softcap) == (
        "gemma3_text", 24 ** -0.5, None, None)
    assert (c.sliding_window, c.sliding_layers) == (8, (True, True, False, True))
    assert (c.rope_theta, c.local_rope_theta, c.rope_scale) == (1e6, 1e4, 0.25)
    assert c.embed_scale_dtype == "bfloat16" and not c.tie_embeddings


def test_config_defaults_are_hugging_faces():
    raw = {k: v for k, v in GEMMA3.items()
           if k not in ("sliding_window", "sliding_window_pattern", "rope_theta",
                        "rope_local_base_freq", "query_pre_attn_scalar", "tie_word_embeddings",
                        "num_hidden_layers")}
    c = config_from_hf(dict(raw, num_hidden_layers=7))
    assert (c.sliding_window, c.sliding_layers) == (4096, (True,) * 5 + (False, True))
    assert (c.rope_theta, c.local_rope_theta, c.query_scale) == (1e6, 1e4, 256 ** -0.5)
    assert c.tie_embeddings


def test_layer_types_override_the_pattern():
    kinds = ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]
    c = config_from_hf(dict(GEMMA3, layer_types=kinds))
    assert c.sliding_layers == (False, True, False, True)


def test_final_logit_softcapping_is_read():
    assert config_from_hf(dict(GEMMA3, final_logit_softcapping=30.0)).final_softcap == 30.0


@pytest.mark.parametrize("change, message", [
    ({"hidden_activation": "silu"}, "hidden_activation 'silu' is not supported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     "rope_scaling type 'llama3' is not supported"),
    ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of "
     "num_key_value_heads 3"),
    ({"sliding_window_pattern": 0}, "sliding_window_pattern must be positive, got 0"),
    ({"layer_types": ["sliding_attention", "global"] * 2}, "layer_types .* is not a list"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention = True is not "
     "supported"),
])
def test_bad_configs_name_the_field(change, message):
    with pytest.raises(ModelError, match=message):
        config_from_hf(dict(GEMMA3, **change))


def gguf_metadata(num_layers: int = 7, **keys) -> GGUFMetadata:
    """Gemma 3 GGUF metadata of the tiny sizes, plus ``keys`` (under the
    ``gemma3.`` prefix), as llama.cpp's converter writes it."""
    metadata = {"general.architecture": "gemma3", "gemma3.embedding_length": 96,
                "gemma3.block_count": num_layers, "gemma3.feed_forward_length": 128,
                "gemma3.attention.head_count": 4, "gemma3.attention.head_count_kv": 2,
                "gemma3.attention.key_length": 16, "gemma3.attention.value_length": 16,
                "gemma3.attention.layer_norm_rms_epsilon": 1e-6, "gemma3.context_length": 512,
                "gemma3.rope.freq_base": 1e6}
    metadata.update({f"gemma3.{k}": v for k, v in keys.items()})
    tokenizer = SimpleNamespace(vocab_size=TINY_CONFIG["vocab_size"], bos_token_id=1,
                                eos_token_ids=(2,))
    tensors = {"token_embd.weight", *(f"blk.{i}.attn_q.weight" for i in range(num_layers))}
    return GGUFMetadata(metadata, tensors, tokenizer)


def test_gguf_config_is_llama_cpps():
    family = family_for_gguf("gemma3")
    c = family.config_from_gguf(gguf_metadata(**{"attention.sliding_window": 8,
                                                 "rope.scaling.type": "linear",
                                                 "rope.scaling.factor": 8.0}))
    # Every sixth layer global, the local base 10000 (unscaled), the
    # global one the file's with its scaling.
    assert (c.sliding_window, c.sliding_layers) == (8, (True,) * 5 + (False, True))
    assert (c.rope_theta, c.rope_scale, c.local_rope_theta) == (1e6, 0.125, 1e4)
    assert (c.family, c.attn_softcap, c.final_softcap, c.query_scale) == (
        "gemma3_text", None, None, 16 ** -0.5)
    assert (c.rope_traditional, c.tie_embeddings, c.embed_scale_dtype) == (
        False, True, "float32")
    # No window: every layer global; the 27B (62 blocks) scales by hidden / heads.
    c = family.config_from_gguf(gguf_metadata(num_layers=62, final_logit_softcapping=30.0))
    assert (c.sliding_window, any(c.sliding_layers), c.final_softcap) == (None, False, 30.0)
    assert c.query_scale == (96 // 4) ** -0.5


def test_gguf_names_are_llama_cpps():
    import gguf
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, 1)
    config = config_from_hf(GEMMA3)
    for w in family_for_gguf("gemma3").weights(config):
        assert names.get_name(w.hf.format(i=0)) == w.gguf.format(i=0)



def test_gguf_gives_the_checkpoints_logits(tmp_path):
    """The GGUF file of a checkpoint, written as llama.cpp's converter does
    (norms stored as ``w + 1``, q/k norms too) with the window pattern key,
    gives the directory's logits: the window layers, the local RoPE base
    (``rope.freq_base_swa``) and the global scaling come from the file. The
    config is one where llama.cpp's fixed choices agree with it: the
    attention scale ``head_dim ** -0.5`` (GGUF names none) and an embedding
    scale exact in bfloat16 (llama.cpp's is the float32 root)."""
    import numpy as np
    from family_checks import PROMPT_IDS, load_tiny, program_logits
    from gguf_writer import write_gguf_from_hf

    config = dict(GEMMA3, hidden_size=64, query_pre_attn_scalar=16)
    checkpoint = write(tmp_path / "hf", config)
    path = write_gguf_from_hf(checkpoint, tmp_path / "model.gguf", tokenizer="bpe",
                              sliding_window_pattern=True)
    gguf, hf = load_tiny(path), load_tiny(checkpoint)
    assert gguf.config.sliding_layers == hf.config.sliding_layers == (True, True, False, True)
    continuation = [5, 60, 7]
    np.testing.assert_allclose(program_logits(gguf, PROMPT_IDS, continuation),
                               program_logits(hf, PROMPT_IDS, continuation),
                               rtol=1e-4, atol=1e-4)
