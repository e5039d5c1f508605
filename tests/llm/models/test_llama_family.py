"""The llama family (Llama, Mistral, Qwen2) against mlx-lm, from tiny
checkpoints mlx-lm writes and loads itself."""

from __future__ import annotations

import pytest
from family_checks import (TINY_CONFIG, check_batch_and_prompt_cache,
                           check_greedy_matches_mlx_lm, check_logits_match_mlx_lm,
                           write_checkpoint)

pytest.importorskip("mlx_lm", reason="mlx-lm (test-only dependency) is not installed")

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


def test_logits_match_mlx_lm(checkpoint):
    check_logits_match_mlx_lm(checkpoint)


def test_greedy_tokens_match_mlx_lm(checkpoint):
    check_greedy_matches_mlx_lm(checkpoint)


def test_batch_and_prompt_cache_match_single_generation(checkpoint):
    check_batch_and_prompt_cache(checkpoint)
