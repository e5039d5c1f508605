"""The gemma2 family against mlx-lm, from tiny checkpoints mlx-lm writes and
loads itself.

mlx-lm's Gemma 2 attends over the whole context on every layer, while
Hugging Face's (which mlxprog follows) gives the even layers a sliding
window. With the default window (4096) the tiny prompts are far inside it
and mlx-lm's own forward pass and generation are the reference. For a
prompt longer than the window (window 8, 40 tokens) the reference is built
here from mlx-lm's loaded model: its embedding, its layers called one by
one (``model.model.layers[i](h, mask, None)``) with a causal mask windowed
on the even layers, its final norm, tied head and soft-cap
(:func:`windowed_logits`).
"""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from family_checks import (PROMPT_IDS, TINY_CONFIG, check_batch_and_prompt_cache,
                           check_greedy_matches_mlx_lm, check_logits_match_mlx_lm, load_tiny,
                           mlx_lm_logits, mlx_lm_model, program_logits, write_checkpoint)

from mlxprog.llm import ModelError
from mlxprog.llm.hf import config_from_hf
from mlxprog.llm.models import family_for_gguf
from mlxprog.llm.models.base import GGUFMetadata

#: hidden_size 96: sqrt(96) is not a bfloat16 value, so the embedding
#: scale's dtype shows; query_pre_attn_scalar differs from head_dim and the
#: attention soft-cap is low enough to bind.
GEMMA2 = dict(TINY_CONFIG, model_type="gemma2", hidden_size=96, tie_word_embeddings=True,
              query_pre_attn_scalar=24, attn_logit_softcapping=5.0,
              final_logit_softcapping=20.0, rope_theta=5000.0)
CONFIGS = {"gemma2": GEMMA2, "gemma2-window": dict(GEMMA2, sliding_window=8)}


WINDOW = CONFIGS["gemma2-window"]["sliding_window"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {name: write_checkpoint(tmp_path_factory.mktemp(name), config)
            for name, config in CONFIGS.items()}


def windowed_logits(model, tokens: list[int], window: int) -> np.ndarray:
    """Hugging Face's Gemma 2 logits after every token ([T, V]) from
    mlx-lm's loaded model: its layers run one by one, the even ones with a
    causal mask limited to the last ``window`` keys."""
    inner = model.model
    h = inner.embed_tokens(mx.array([tokens])) * (inner.args.hidden_size ** 0.5)
    query, key = mx.arange(len(tokens))[:, None], mx.arange(len(tokens))[None]
    causal = key <= query
    local = causal & (key > query - window)
    for i, layer in enumerate(inner.layers):
        h = layer(h, local if i % 2 == 0 else causal, None)
    logits = inner.embed_tokens.as_linear(inner.norm(h))
    cap = model.final_logit_softcapping
    return np.array(mx.tanh(logits / cap) * cap)[0]


def windowed_greedy(model, prompt: list[int], n: int, window: int) -> list[int]:
    """``n`` greedy tokens by :func:`windowed_logits` (the whole sequence
    run again for each)."""
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(np.argmax(windowed_logits(model, tokens, window)[-1])))
    return tokens[len(prompt):]


def test_logits_match_mlx_lm(checkpoints):
    check_logits_match_mlx_lm(checkpoints["gemma2"])


def test_greedy_tokens_match_mlx_lm(checkpoints):
    check_greedy_matches_mlx_lm(checkpoints["gemma2"])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_batch_and_prompt_cache_match_single_generation(checkpoints, name):
    check_batch_and_prompt_cache(checkpoints[name])


def test_sliding_window_logits_match_masked_reference(checkpoints):
    directory = checkpoints["gemma2-window"]
    model = mlx_lm_model(directory)
    continuation = windowed_greedy(model, PROMPT_IDS, 6, WINDOW)
    expected = windowed_logits(model, PROMPT_IDS + continuation, WINDOW)[len(PROMPT_IDS) - 1:]
    # The window matters: mlx-lm's unwindowed logits are far from these.
    unwindowed = mlx_lm_logits(model, PROMPT_IDS + continuation)[len(PROMPT_IDS) - 1:]
    assert np.abs(unwindowed - expected).max() > 0.1
    ours = program_logits(load_tiny(directory), PROMPT_IDS, continuation)
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)


def test_sliding_window_greedy_matches_masked_reference(checkpoints):
    directory = checkpoints["gemma2-window"]
    expected = windowed_greedy(mlx_lm_model(directory), PROMPT_IDS, 12, WINDOW)
    out = load_tiny(directory).generate(PROMPT_IDS, max_tokens=12, chat=False)
    eos = 2  # the tiny tokenizer's
    stop = expected.index(eos) if eos in expected else len(expected)
    assert out.tokens == expected[:stop]


def test_config_reads_gemma2_settings():
    c = config_from_hf(dict(GEMMA2, sliding_window=8, num_hidden_layers=4))
    assert (c.family, c.query_scale, c.attn_softcap, c.final_softcap) == (
        "gemma2", 24 ** -0.5, 5.0, 20.0)
    assert (c.sliding_window, c.sliding_layers) == (8, (True, False, True, False))
    assert c.tie_embeddings and c.rope_theta == 5000.0


def test_config_defaults_are_hugging_faces():
    raw = {k: v for k, v in GEMMA2.items()
           if k not in ("attn_logit_softcapping", "final_logit_softcapping",
                        "query_pre_attn_scalar", "tie_word_embeddings")}
    c = config_from_hf(raw)
    assert (c.attn_softcap, c.final_softcap, c.query_scale, c.sliding_window) == (
        50.0, 30.0, 256 ** -0.5, 4096)
    assert c.tie_embeddings
    # An explicit null turns a soft-cap off.
    assert config_from_hf(dict(GEMMA2, final_logit_softcapping=None)).final_softcap is None


def test_layer_types_choose_the_sliding_layers():
    kinds = ["full_attention", "sliding_attention", "sliding_attention"]
    assert config_from_hf(dict(GEMMA2, layer_types=kinds)).sliding_layers == (False, True, True)


@pytest.mark.parametrize("change, message", [
    ({"hidden_activation": "gelu"}, "hidden_activation 'gelu' is not supported"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}},
     "rope_scaling type 'yarn' is not supported"),
    ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of "
     "num_key_value_heads 3"),
    ({"attention_bias": True}, "attention_bias = True is not supported"),
    ({"attn_logit_softcapping": 0}, "attn_logit_softcapping must be positive, got 0"),
    ({"layer_types": ["sliding_attention"]}, "layer_types .* is not a list of 3 entries"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
     "rope_parameters = .* is not supported"),
])
def test_bad_configs_name_the_field(change, message):
    with pytest.raises(ModelError, match=message):
        config_from_hf(dict(GEMMA2, **change))


def gguf_metadata(num_layers: int = 3, **keys) -> GGUFMetadata:
    """Gemma 2 GGUF metadata of the tiny sizes, plus ``keys`` (under the
    ``gemma2.`` prefix), as llama.cpp's converter writes it."""
    metadata = {"general.architecture": "gemma2", "gemma2.embedding_length": 96,
                "gemma2.block_count": num_layers, "gemma2.feed_forward_length": 128,
                "gemma2.attention.head_count": 4, "gemma2.attention.head_count_kv": 2,
                "gemma2.attention.key_length": 16, "gemma2.attention.value_length": 16,
                "gemma2.attention.layer_norm_rms_epsilon": 1e-6, "gemma2.context_length": 512}
    metadata.update({f"gemma2.{k}": v for k, v in keys.items()})
    tokenizer = SimpleNamespace(vocab_size=TINY_CONFIG["vocab_size"], bos_token_id=1,
                                eos_token_ids=(2,))
    tensors = {"token_embd.weight", *(f"blk.{i}.attn_q.weight" for i in range(num_layers))}
    return GGUFMetadata(metadata, tensors, tokenizer)


def test_gguf_config_is_llama_cpps():
    family = family_for_gguf("gemma2")
    c = family.config_from_gguf(gguf_metadata(**{"attention.sliding_window": 8,
                                                 "attn_logit_softcapping": 5.0,
                                                 "final_logit_softcapping": 20.0}))
    assert (c.family, c.attn_softcap, c.final_softcap, c.query_scale) == (
        "gemma2", 5.0, 20.0, 16 ** -0.5)
    assert (c.sliding_window, c.sliding_layers) == (8, (True, False, True))
    assert (c.rope_traditional, c.tie_embeddings, c.embed_scale_dtype) == (
        False, True, "float32")
    # llama.cpp's defaults; its 27B (46 blocks) scales by hidden / heads.
    c = family.config_from_gguf(gguf_metadata(num_layers=46))
    assert (c.attn_softcap, c.final_softcap, c.sliding_window) == (50.0, 30.0, 4096)
    assert c.query_scale == (96 // 4) ** -0.5


def test_gguf_names_are_llama_cpps():
    import gguf
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA2, 1)
    config = config_from_hf(GEMMA2)  # tied: llama.cpp's Gemma 2 has no output tensor
    for w in family_for_gguf("gemma2").weights(config):
        if w.present(config):
            assert names.get_name(w.hf.format(i=0)) == w.gguf.format(i=0)



def test_gguf_gives_the_checkpoints_logits(tmp_path):
    """The GGUF file of a checkpoint with a window, written as llama.cpp's
    converter does (norms stored as ``w + 1``, soft-caps and window in the
    metadata, no head), gives the directory's logits. The config is one
    where llama.cpp's fixed choices agree with it: the attention scale
    ``head_dim ** -0.5`` and RoPE base 10000 (GGUF names neither)."""
    from family_checks import PROMPT_IDS, load_tiny, program_logits
    from gguf_writer import write_gguf_from_hf

    config = dict(CONFIGS["gemma2-window"], query_pre_attn_scalar=16, rope_theta=10000.0)
    checkpoint = write_checkpoint(tmp_path / "hf", config)
    gguf = load_tiny(write_gguf_from_hf(checkpoint, tmp_path / "model.gguf", tokenizer="bpe"))
    hf = load_tiny(checkpoint)
    continuation = [5, 60, 7]
    np.testing.assert_allclose(program_logits(gguf, PROMPT_IDS, continuation),
                               program_logits(hf, PROMPT_IDS, continuation),
                               rtol=1e-4, atol=1e-4)
