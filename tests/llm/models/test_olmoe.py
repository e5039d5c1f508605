"""The olmoe family against mlx-lm, from tiny checkpoints mlx-lm writes and
loads itself: logits, greedy tokens, batches and prompt caches (q/k normed
over the whole projection, not per head); the experts' per-expert,
quantized and GGUF layouts; configs it refuses."""

from __future__ import annotations

import pytest
from family_checks import (TINY_CONFIG, MlxLmParity, MoEChecks,
                           check_two_ranks_generate_as_one_process, load_tiny, write_checkpoint)

from mlxprog.llm import ModelError
from mlxprog.llm.hf import config_from_hf

OLMOE = dict(TINY_CONFIG, model_type="olmoe", num_experts=8, num_experts_per_tok=2,
             rms_norm_eps=1e-5, rope_theta=10000.0)
CONFIGS = {
    "olmoe": OLMOE,
    "olmoe-renormalized-tied": dict(OLMOE, norm_topk_prob=True, tie_word_embeddings=True),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp(request.param), CONFIGS[request.param])


class TestMlxLmParity(MlxLmParity):
    """Logits, greedy tokens, batches and prompt caches against mlx-lm."""


class TestExperts(MoEChecks):
    """The experts' layouts: per expert, quantized, GGUF."""

    def not_in_gguf(self, config: dict) -> str | None:
        if config.get("norm_topk_prob"):
            return "llama.cpp's olmoe never renormalizes the kept weights"
        return super().not_in_gguf(config)


def test_qk_norms_span_the_whole_projection(checkpoint):
    llm = load_tiny(checkpoint)
    c = llm.config
    assert llm.checkpoint.weights["layers.0.self_attn.q_norm.weight"].shape == (
        c.num_heads * c.head_dim,)
    assert llm.checkpoint.weights["layers.0.self_attn.k_norm.weight"].shape == (
        c.num_kv_heads * c.head_dim,)


@pytest.mark.parametrize("changes, message", [
    (dict(clip_qkv=8.0), "clip_qkv = 8.0 is not supported by the olmoe family"),
    (dict(attention_bias=True), "attention_bias = True is not supported by the olmoe family"),
    (dict(mlp_bias=True), "mlp_bias = True is not supported by the olmoe family"),
    (dict(num_experts_per_tok=0), "num_experts_per_tok must be a positive integer"),
])
def test_bad_configs_name_the_key(changes, message):
    with pytest.raises(ModelError, match=message):
        config_from_hf(dict(OLMOE, **changes))


def test_two_ranks_norm_over_all_heads(tmp_path):
    """Split across two ranks (each a block of the heads), the q/k norms
    still span every head: one process's tokens."""
    check_two_ranks_generate_as_one_process(write_checkpoint(tmp_path / "olmoe", OLMOE))
