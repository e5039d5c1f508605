"""The hyperparameters of a decoder every model family has
(:class:`ModelConfig`); a family with settings of its own subclasses it
(see :mod:`mlxprog.llm.models`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

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
