"""The qwen3 family: Qwen3 (the dense models).

Qwen2's decoder without the q/k/v biases, plus an RMS norm over each query
and key head (``self_attn.q_norm`` / ``k_norm``, weight ``[head_dim]``)
between the projection and RoPE. ``head_dim`` is explicit and need not be
``hidden_size / num_attention_heads`` (Qwen3-0.6B: 128 against 1024 / 16).
llama.cpp's converter keeps the Hugging Face half-split RoPE layout for
Qwen3's Q/K rows (NEOX, as for Qwen2), so GGUF files are not
``traditional``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config import ModelConfig
from .base import Family, GGUFMetadata, HFConfig, Weight
from .llama import LlamaDecoder, decoder_weights, reject_sliding_window, rope_scaling_from_hf

if TYPE_CHECKING:
    from ...builder import Value


def head_norm(kind: str) -> Weight:
    """The per-head RMS norm of the ``kind`` ("q" or "k") heads: one
    ``[head_dim]`` weight every head (and every rank) shares."""
    return Weight(f"layers.{{i}}.self_attn.{kind}_norm", lambda c: (c.head_dim,),
                  hf=f"model.layers.{{i}}.self_attn.{kind}_norm",
                  gguf=f"blk.{{i}}.attn_{kind}_norm", matrix=False)


_WEIGHTS = decoder_weights() + (head_norm("q"), head_norm("k"))


def qwen_hf_fields(hf: HFConfig) -> dict[str, Any]:
    """The :class:`ModelConfig` fields of a Qwen ``config.json`` (Qwen3's,
    and the Qwen2/Qwen3 mixtures of experts'): SiLU only, no sliding window
    shorter than the context, RoPE scaling none or linear."""
    hf.choice("hidden_act", ("silu",), "silu")
    fields = hf.common()
    # Unlike Mistral's, Qwen's sliding window is off unless
    # use_sliding_window turns it on (its configs often name one they do not
    # use).
    if hf.get("use_sliding_window", False):
        reject_sliding_window(hf, fields["context_length"])
    rope = rope_scaling_from_hf(hf, fields["rope_theta"], fields["head_dim"],
                                allowed=("default", "linear"))
    return dict(fields, rope_scale=rope.scale, rope_freqs=rope.freqs)


class Qwen3Family(Family):
    """Qwen3 (see the module docstring)."""

    name = "qwen3"
    hf_model_types = ("qwen3",)
    gguf_architectures = ("qwen3",)

    def config_from_hf(self, hf: HFConfig) -> ModelConfig:
        """Qwen3 ``config.json``: SiLU only, no projection biases, no sliding
        window shorter than the context; RoPE scaling none or linear."""
        # Hugging Face's Qwen3 puts this bias on q, k, v and o; no released
        # Qwen3 has one.
        hf.reject("attention_bias", "projection biases")
        return ModelConfig(**qwen_hf_fields(hf), family=self.name)

    def config_from_gguf(self, gguf: GGUFMetadata) -> ModelConfig:
        """Qwen3 GGUF metadata: full-width RoPE in the half-split layout,
        linear scaling at most."""
        fields = gguf.common()
        gguf.require_full_rope(fields["head_dim"], "qwen3")
        return ModelConfig(**fields, family=self.name, rope_traditional=False,
                           rope_scale=gguf.linear_rope_scale())

    def weights(self, config: ModelConfig) -> tuple[Weight, ...]:
        """The llama layout without biases, plus the per-head q/k norms."""
        return _WEIGHTS


class Qwen3Decoder(LlamaDecoder):
    """The llama forward pass with q and k normed per head before RoPE: by
    the fused attention block or whole-layer op (:meth:`head_norms`), or
    by :meth:`qkv` where a subclass turns those off."""

    def head_norms(self, sb, i: int) -> tuple[list[Value], dict[str, Any]]:
        """Layer ``i``'s q and k norm weights (float32) and their eps, for
        the attention-block and whole-layer ops."""
        p = f"layers.{i}.self_attn"
        weights = [sb.astype(self.weight(f"{p}.{kind}_norm.weight"), dtype="float32")
                   for kind in "qk"]
        return weights, {"qk_norm_eps": self.c.norm_eps}

    def qkv(self, sb, i: int, x: Value, T, rope_offset) -> tuple[Value, Value, Value]:
        """Layer ``i``'s queries, keys and values of the normed ``x``
        (``[B, heads, T, D]``): q and k normed over each head, then
        rotated. With the fused projection, one matmul split three ways.
        (Qwen3 itself runs the fused ops; Gemma 3, whose attention they do
        not cover, takes this.)"""
        p = f"layers.{i}.self_attn"
        heads, kv_heads = self.shard.num_heads, self.shard.num_kv_heads
        if f"{p}.qkv_proj" in self.spec.fused:
            y = self.heads(sb, self.linear(sb, f"{p}.qkv_proj", x), heads + 2 * kv_heads, T)
            q, k, v = sb.split(y, indices_or_sections=[heads, heads + kv_heads], axis=1)
        else:
            q = self.heads(sb, self.linear(sb, f"{p}.q_proj", x), heads, T)
            k = self.heads(sb, self.linear(sb, f"{p}.k_proj", x), kv_heads, T)
            v = self.heads(sb, self.linear(sb, f"{p}.v_proj", x), kv_heads, T)
        rope = self.rope_settings(i)
        q = self.rope(sb, self.norm(sb, f"{p}.q_norm.weight", q), rope_offset, **rope)
        k = self.rope(sb, self.norm(sb, f"{p}.k_norm.weight", k), rope_offset, **rope)
        return q, k, v


Qwen3Family.decoder = Qwen3Decoder
FAMILY = Qwen3Family()
