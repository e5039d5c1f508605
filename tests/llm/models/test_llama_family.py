"""The llama family (Llama, Mistral, Qwen2) against mlx-lm, from tiny
checkpoints mlx-lm writes and loads itself; and the GGUF files llama.cpp's
converter would make of them against the checkpoints."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from family_checks import (MlxLmParity, PROMPT_IDS, TINY_CONFIG, load_tiny,
                           program_logits, write_checkpoint)

CONFIGS = {
    "llama": dict(TINY_CONFIG, model_type="llama", rope_theta=5000.0),
    "llama3-scaled": dict(TINY_CONFIG, model_type="llama", tie_word_embeddings=True,
                          rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 32}),
    "mistral": dict(TINY_CONFIG, model_type="mistral", rope_theta=1e6),
    "qwen2": dict(TINY_CONFIG, model_type="qwen2", tie_word_embeddings=True, rope_theta=1e6),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp(request.param), CONFIGS[request.param])


class TestMlxLmParity(MlxLmParity):
    """Logits, greedy tokens, batches and prompt caches against mlx-lm, for
    every config."""


def test_gguf_logits_match_the_hf_checkpoint(checkpoint, tmp_path):
    """The float32 GGUF llama.cpp's converter would write of the checkpoint
    (:func:`gguf_writer.write_gguf_from_hf`: the gguf package's own tensor
    names and metadata keys) gives the checkpoint's logits, prefill and
    decode steps. Llama's (and Mistral's) Q/K rows are permuted into the
    interleaved RoPE layout, which the loader must undo by rotating
    traditionally; Qwen2's keep the half-split layout."""
    from gguf_writer import write_gguf_from_hf

    path = write_gguf_from_hf(checkpoint, tmp_path / "model.gguf")
    model_type = json.loads((checkpoint / "config.json").read_text())["model_type"]
    interleaved = model_type in ("llama", "mistral")
    tensors = mx.load(str(path))
    hf = mx.load(str(checkpoint / "model.safetensors"))
    q_same = np.array_equal(np.array(tensors["blk.0.attn_q.weight"]),
                            np.array(hf["model.layers.0.self_attn.q_proj.weight"]))
    assert q_same != interleaved  # the converter permuted the rows, or kept them
    llm = load_tiny(path)
    assert llm.config.rope_traditional == interleaved
    continuation = [5, 77, 200, 9, 31, 150]
    expected = program_logits(load_tiny(checkpoint), PROMPT_IDS, continuation)
    ours = program_logits(llm, PROMPT_IDS, continuation)
    assert np.abs(expected).max() > 1  # not trivially small
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)
