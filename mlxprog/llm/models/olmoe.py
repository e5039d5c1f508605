"""The olmoe family: OLMoE (OLMoE-1B-7B).

A pre-norm decoder like llama's whose queries and keys are RMS-normed
over the whole projection (``q_norm`` of ``heads * head_dim``, ``k_norm``
of ``kv_heads * head_dim``: one norm across all heads, not one per head as
Qwen3's) before RoPE, with a mixture of experts for the MLP: the router's
softmax over every expert, the ``num_experts_per_tok`` best kept,
renormalized only with ``norm_topk_prob``; each expert a SwiGLU of width
``intermediate_size``. llama.cpp's ``olmoe`` files keep the half-split RoPE
layout and do not renormalize.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import ModelConfig, MoEConfig
from ..spec import ROWS_BY_HEADS, ROWS_BY_KV_HEADS, Split
from .base import Family, GGUFMetadata, HFConfig, Weight, moe_weights
from .llama import LlamaDecoder, decoder_weights, rope_scaling_from_hf

if TYPE_CHECKING:
    from ...builder import Value


def _projection_norm(kind: str, heads: str, split: Split) -> Weight:
    """The RMS norm over the whole ``kind`` ("q" or "k") projection (its
    ``heads`` times head_dim features), split across ranks as the
    projection's rows are."""
    return Weight(f"layers.{{i}}.self_attn.{kind}_norm",
                  lambda c: (getattr(c, heads) * c.head_dim,),
                  hf=f"model.layers.{{i}}.self_attn.{kind}_norm",
                  gguf=f"blk.{{i}}.attn_{kind}_norm", matrix=False, split=split)


_WEIGHTS = (tuple(w for w in decoder_weights() if not w.name.startswith("layers.{i}.mlp."))
            + (_projection_norm("q", "num_heads", ROWS_BY_HEADS),
               _projection_norm("k", "num_kv_heads", ROWS_BY_KV_HEADS))
            + moe_weights())


class OlmoeFamily(Family):
    """OLMoE (see the module docstring)."""

    name = "olmoe"
    hf_model_types = ("olmoe",)
    gguf_architectures = ("olmoe",)

    def config_from_hf(self, hf: HFConfig) -> MoEConfig:
        """OLMoE ``config.json``: SiLU, no q/k/v clipping, no biases,
        RoPE scaling none or linear; the experts' count, top-k and
        renormalization."""
        hf.choice("hidden_act", ("silu",), "silu")
        hf.reject("clip_qkv", "clipping of the q/k/v projections")
        hf.reject("mlp_bias", "expert biases")
        hf.reject("attention_bias", "projection biases")
        fields = hf.common()
        rope = rope_scaling_from_hf(hf, fields["rope_theta"], fields["head_dim"],
                                    allowed=("default", "linear"))
        count, used = hf.experts()
        return MoEConfig(**fields, family=self.name, rope_scale=rope.scale, rope_freqs=rope.freqs,
                         num_experts=count, experts_per_token=used,
                         expert_intermediate_size=fields["intermediate_size"],
                         router="softmax_topk",
                         renormalize=bool(hf.get("norm_topk_prob", False)))

    def config_from_gguf(self, gguf: GGUFMetadata) -> MoEConfig:
        """OLMoE GGUF metadata: half-split RoPE, the experts' count, top-k
        and width; the kept weights not renormalized (llama.cpp's)."""
        fields = gguf.common()
        gguf.require_full_rope(fields["head_dim"], self.name)
        return MoEConfig(**fields, **gguf.expert_fields(), family=self.name,
                         rope_traditional=False, rope_scale=gguf.linear_rope_scale(),
                         router="softmax_topk",
                         renormalize=gguf.flag("expert_weights_norm", False))

    def weights(self, config: ModelConfig) -> tuple[Weight, ...]:
        """The llama layout with the whole-projection q/k norms and the
        experts in place of the MLP."""
        return _WEIGHTS


class OlmoeDecoder(LlamaDecoder):
    """The llama forward pass with q and k normed over the whole projection
    before RoPE, and the mixture of experts for the MLP."""

    # The fused attention block rotates the projection's output directly:
    # it has no place for the norms.
    fused_attention = False

    def qkv(self, sb, i: int, x: Value, T, rope_offset) -> tuple[Value, Value, Value]:
        """Layer ``i``'s queries, keys and values of the normed ``x``
        (``[B, heads, T, D]``): q and k normed over all their features, then
        split into heads and rotated."""
        p = f"layers.{i}.self_attn"
        heads, kv_heads = self.shard.num_heads, self.shard.num_kv_heads
        q = self.projection_norm(sb, f"{p}.q_norm.weight", self.linear(sb, f"{p}.q_proj", x),
                                 self.c.num_heads)
        k = self.projection_norm(sb, f"{p}.k_norm.weight", self.linear(sb, f"{p}.k_proj", x),
                                 self.c.num_kv_heads)
        v = self.linear(sb, f"{p}.v_proj", x)
        return (self.rope(sb, self.heads(sb, q, heads, T), rope_offset),
                self.rope(sb, self.heads(sb, k, kv_heads, T), rope_offset),
                self.heads(sb, v, kv_heads, T))

    def projection_norm(self, sb, name: str, x: Value, heads: int) -> Value:
        """RMS norm by weight ``name`` of a projection's output ``x`` [B, T,
        features] over all ``heads`` heads' features: on one rank a norm
        over the last axis; split across ranks (each holding a block of the
        heads), the ranks' sums of squares are added first."""
        if self.shard.world_size == 1:
            return self.norm(sb, name, x)
        squares = sb.all_sum(sb.sum(sb.square(x), axes=[-1], keepdims=True))
        scale = sb.rsqrt(squares / float(heads * self.c.head_dim) + self.c.norm_eps)
        return x * scale * sb.astype(self.weight(name), dtype="float32")

    def mlp(self, sb, i: int, x: Value) -> Value:
        """Layer ``i``'s mixture of experts of the normed ``x``."""
        return self.moe(sb, f"layers.{i}.mlp", x)


OlmoeFamily.decoder = OlmoeDecoder
FAMILY = OlmoeFamily()
