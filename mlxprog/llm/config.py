"""The hyperparameters of a decoder every model family has
(:class:`ModelConfig`); a family with settings of its own subclasses it
(see :mod:`mlxprog.llm.models`), the mixtures of experts
:class:`MoEConfig`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import mlx.core as mx

from ..arrays import is_int
from ..errors import ModelError


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of a decoder: the fields every family has. ``family``
    names the model family (:mod:`mlxprog.llm.models`) whose weight table and
    forward pass the config is for; a family with settings of its own
    (soft-capping, sliding windows, ...) adds them in a subclass.

    The RoPE fields map onto :func:`mlx.core.fast.rope` (see :meth:`rope_kwargs`):
    ``rope_traditional`` is True for GGUF files (llama.cpp's converter permutes
    the Q/K rows into the interleaved layout) and False for Hugging Face
    checkpoints; ``rope_scale`` multiplies positions (linear scaling is
    ``1 / factor``); ``rope_freqs``, when set, holds the per-pair periods that
    replace ``rope_theta ** (2i / head_dim)`` (llama3-style scaling).
    """

    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    norm_eps: float
    rope_theta: float
    rope_traditional: bool
    tie_embeddings: bool
    context_length: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    attention_bias: bool = False
    rope_scale: float = 1.0
    rope_freqs: tuple[float, ...] | None = None
    family: str = "llama"

    def __post_init__(self) -> None:
        sizes = {
            "num_layers": self.num_layers, "hidden_size": self.hidden_size,
            "num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size, "context_length": self.context_length,
        }
        for name, value in sizes.items():
            if not isinstance(value, int) or value <= 0:
                raise ModelError(f"model config: {name} must be a positive integer, got {value!r}")
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise ModelError(f"model config: rope_theta must be a positive number, got "
                             f"{self.rope_theta!r}")
        if not (math.isfinite(self.norm_eps) and self.norm_eps >= 0):
            raise ModelError(f"model config: norm_eps must be a number of at least 0, got "
                             f"{self.norm_eps!r}")
        if self.num_heads % self.num_kv_heads:
            raise ModelError(f"model config: num_heads ({self.num_heads}) is not a multiple "
                             f"of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ModelError(f"model config: head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_freqs is not None and len(self.rope_freqs) != self.head_dim // 2:
            raise ModelError(f"model config: rope_freqs has {len(self.rope_freqs)} entries, "
                             f"expected head_dim / 2 = {self.head_dim // 2}")

    def rope_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``mx.fast.rope(x, offset=..., **config.rope_kwargs())``."""
        freqs = None if self.rope_freqs is None else mx.array(self.rope_freqs, dtype=mx.float32)
        return {
            "dims": self.head_dim,
            "traditional": self.rope_traditional,
            "base": None if freqs is not None else self.rope_theta,
            "scale": self.rope_scale,
            "freqs": freqs,
        }


#: A router's scoring: ``moe_route``'s ``scoring`` attribute.
Scoring = Literal["softmax_topk", "topk_softmax"]


def check_expert_counts(count_key: str, count: Any, used_key: str, used: Any) -> None:
    """A mixture's expert count and experts per token are integers with
    1 <= used <= count; else a :class:`ModelError` naming the keys."""
    for key, value in ((count_key, count), (used_key, used)):
        if not is_int(value) or value < 1:
            raise ModelError(f"{key} must be a positive integer, got {value!r}")
    if used > count:
        raise ModelError(f"{used_key} {used} is more than the {count} experts of {count_key}")


@dataclass(frozen=True)
class MoEConfig(ModelConfig):
    """A decoder whose MLPs are mixtures of experts: ``num_experts``
    SwiGLU experts of width ``expert_intermediate_size``, of which each
    token runs ``experts_per_token``, chosen and weighted by the layer's
    router (``router``: ``softmax_topk``, a softmax over every expert then
    the k best, renormalized over them with ``renormalize``; or
    ``topk_softmax``, the k best logits then a softmax over them). A
    ``shared_expert_intermediate_size`` above zero adds Qwen2-MoE's shared
    expert (a SwiGLU every token runs, scaled by a sigmoid gate); the
    ``dense_layers`` have an ordinary MLP of ``intermediate_size`` instead
    of experts."""

    num_experts: int = 1
    experts_per_token: int = 1
    expert_intermediate_size: int = 1
    router: Scoring = "softmax_topk"
    renormalize: bool = False
    shared_expert_intermediate_size: int = 0
    dense_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        check_expert_counts("model config: num_experts", self.num_experts,
                            "model config: experts_per_token", self.experts_per_token)
        if not is_int(self.expert_intermediate_size) or self.expert_intermediate_size < 1:
            raise ModelError("model config: expert_intermediate_size must be a positive "
                             f"integer, got {self.expert_intermediate_size!r}")
        if self.renormalize and self.router != "softmax_topk":
            raise ModelError(f"model config: renormalize applies to softmax_topk routing, "
                             f"not {self.router}")
        outside = [i for i in self.dense_layers if not 0 <= i < self.num_layers]
        if outside:
            raise ModelError(f"model config: dense layers {outside} are not layers of the "
                             f"{self.num_layers}")

    def expert_layers(self) -> list[int]:
        """The layers whose MLP is the mixture of experts."""
        return [i for i in range(self.num_layers) if i not in self.dense_layers]
