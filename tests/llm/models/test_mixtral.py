"""The mixtral family against mlx-lm, from tiny checkpoints mlx-lm writes
and loads itself: logits, greedy tokens, batches and prompt caches (top-k
of the logits, then a softmax over them); the experts' per-expert (``w1``,
``w3``, ``w2``), quantized and GGUF layouts; llama.cpp's ``llama`` files
with experts read by this family, those without by the llama family."""

from __future__ import annotations

import pytest
from family_checks import TINY_CONFIG, MlxLmParity, MoEChecks, load_tiny, write_checkpoint

from mlxprog.llm import ModelError
from mlxprog.llm.hf import config_from_hf
from mlxprog.llm.models import family_for_gguf

MIXTRAL = dict(TINY_CONFIG, model_type="mixtral", rope_theta=1e6, num_local_experts=4,
               num_experts_per_tok=2)
CONFIGS = {
    "mixtral": MIXTRAL,
    "mixtral-top1-tied": dict(MIXTRAL, num_experts_per_tok=1, tie_word_embeddings=True),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp(request.param), CONFIGS[request.param])


class TestMlxLmParity(MlxLmParity):
    """Logits, greedy tokens, batches and prompt caches against mlx-lm."""


class TestExperts(MoEChecks):
    """The experts' layouts: per expert (Hugging Face's w1/w3/w2), quantized,
    GGUF."""

    EXPERT_NAMES = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def test_llama_gguf_files_with_experts_are_mixtral(checkpoint, tmp_path):
    from gguf_writer import write_gguf_from_hf

    llm = load_tiny(write_gguf_from_hf(checkpoint, tmp_path / "model.gguf"))
    assert (llm.config.family, llm.config.architecture, llm.config.rope_traditional,
            llm.config.router) == ("mixtral", "llama", True, "topk_softmax")
    assert family_for_gguf("llama", {"llama.expert_count": 8}).name == "mixtral"
    assert family_for_gguf("llama", {}).name == "llama"
    assert family_for_gguf("llama").name == "llama"


def test_bad_configs_name_the_key():
    with pytest.raises(ModelError, match="config.json lacks 'num_local_experts'"):
        config_from_hf({k: v for k, v in MIXTRAL.items() if k != "num_local_experts"})
    with pytest.raises(ModelError, match="num_experts_per_tok 5 is more than the 4 experts"):
        config_from_hf(dict(MIXTRAL, num_experts_per_tok=5))
    with pytest.raises(ModelError, match="sliding_window 32"):
        config_from_hf(dict(MIXTRAL, sliding_window=32))
