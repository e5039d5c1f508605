"""The phi3 family: Phi-3, Phi-3.5 and Phi-4 (mini and dense).

The llama decoder (pre-norm, grouped-query attention, SwiGLU, no biases)
with the q/k/v projections stored as one ``self_attn.qkv_proj`` (q, k, v
rows in order) and gate/up as one ``mlp.gate_up_proj`` (gate rows first);
llama.cpp's converter keeps them fused too (``blk.N.attn_qkv``, and
``blk.N.ffn_up`` holding gate then up). They are split by rows at load, so
the tensor-parallel split and the programs' own fusion treat them as
llama's. ``head_dim`` is ``hidden_size / num_attention_heads``.

RoPE is half-split (NEOX) in both formats and may cover only the first
``int(head_dim * partial_rotary_factor)`` features of a head (Phi-4-mini:
0.75; GGUF: ``phi3.rope.dimension_count``). Scaling is none, ``linear``
(positions times ``1 / factor``) or ``longrope`` (``su``): the rotated
features' periods are ``long_factor[i] * rope_theta ** (2i / dims)`` and
those features are scaled by ``attention_factor`` (GGUF:
``phi3.rope.scaling.attn_factor``), by default ``sqrt(1 + log(f) /
log(original_max_position_embeddings))`` with ``f`` the context's growth
over the original (1 when it does not grow). As mlx-lm does, the long
factors serve every position: Hugging Face uses the short ones while the
sequence fits in ``original_max_position_embeddings``, so short sequences
of a long-context model differ slightly from Hugging Face's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from ...errors import ModelError
from ..config import ModelConfig
from .base import Family, GGUFMetadata, HFConfig, Rows, Weight
from .llama import LlamaDecoder, decoder_weights

if TYPE_CHECKING:
    from ...builder import Value


@dataclass(frozen=True, kw_only=True)
class Phi3Config(ModelConfig):
    """A phi3 model's config: :class:`ModelConfig` plus partial RoPE and
    longrope. ``rope_dims`` features of each head are rotated (the rest
    pass through); ``rotary_freqs``, when set, holds their per-pair periods
    (``rope_dims / 2`` of them: :attr:`ModelConfig.rope_freqs` covers the
    whole head) and ``rotated_scale`` multiplies them before the rotation."""

    rope_dims: int
    rotary_freqs: tuple[float, ...] | None = None
    rotated_scale: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.rope_dims <= self.head_dim or self.rope_dims % 2:
            raise ModelError(f"model config: rope_dims must be even and in (0, head_dim "
                             f"{self.head_dim}], got {self.rope_dims}")
        if self.rotary_freqs is not None and len(self.rotary_freqs) != self.rope_dims // 2:
            raise ModelError(f"model config: rotary_freqs has {len(self.rotary_freqs)} entries, "
                             f"expected rope_dims / 2 = {self.rope_dims // 2}")


def _q_out(c: ModelConfig) -> int:
    return c.num_heads * c.head_dim


def _kv_out(c: ModelConfig) -> int:
    return c.num_kv_heads * c.head_dim


_LLAMA = {w.name.rsplit(".", 1)[-1]: w for w in decoder_weights()}
_QKV = ("model.layers.{i}.self_attn.qkv_proj", "blk.{i}.attn_qkv")
_GATE_UP = ("model.layers.{i}.mlp.gate_up_proj", "blk.{i}.ffn_up")


def _fused(key: str, stored: tuple[str, str], rows: Rows) -> Weight:
    """Llama's table entry ``key`` read as ``rows`` of the fused tensor
    ``stored`` (its Hugging Face and GGUF stems)."""
    hf, gguf = stored
    return dataclasses.replace(_LLAMA[key], hf=hf, gguf=gguf, hf_rows=rows, gguf_rows=rows)


_WEIGHTS = decoder_weights(
    q_proj=_fused("q_proj", _QKV, lambda c: (0, _q_out(c))),
    k_proj=_fused("k_proj", _QKV, lambda c: (_q_out(c), _q_out(c) + _kv_out(c))),
    v_proj=_fused("v_proj", _QKV, lambda c: (_q_out(c) + _kv_out(c), _q_out(c) + 2 * _kv_out(c))),
    gate_proj=_fused("gate_proj", _GATE_UP, lambda c: (0, c.intermediate_size)),
    up_proj=_fused("up_proj", _GATE_UP, lambda c: (c.intermediate_size, 2 * c.intermediate_size)))


def _longrope(theta: float, dims: int, long_factor: Any, context: int, original: int,
              attention_factor: Any, names: tuple[str, str, str]
              ) -> tuple[tuple[float, ...], float]:
    """(per-pair periods, rotated-feature scale) of longrope scaling, as
    mlx-lm's ``SuScaledRoPE`` computes them (float32 periods); ``names``
    are those of the long factors, the original context length and the
    attention factor in their source, for errors."""
    factors_name, original_name, attention_name = names
    try:
        factors = mx.array(long_factor, dtype=mx.float32)
    except (TypeError, ValueError):
        raise ModelError(f"{factors_name} must be a list of numbers, "
                         f"got {long_factor!r}") from None
    if factors.shape != (dims // 2,):
        raise ModelError(f"{factors_name} has {factors.size} entries, expected rope dims / 2 = "
                         f"{dims // 2}")
    if original < 2:
        raise ModelError(f"{original_name} must be at least 2, got {original}")
    periods = theta ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
    if attention_factor is None:
        growth = context / original
        attention_factor = (math.sqrt(1 + math.log(growth) / math.log(original))
                            if growth > 1 else 1.0)
    elif isinstance(attention_factor, bool) or not isinstance(attention_factor, (int, float)):
        raise ModelError(f"{attention_name} must be a number, got {attention_factor!r}")
    return tuple((factors * periods).tolist()), float(attention_factor)


def _rope_dims(head_dim: int, dims: int, what: str) -> int:
    """The rotated features, checked: even and within the head."""
    if not 0 < dims <= head_dim or dims % 2:
        raise ModelError(f"{what} gives {dims} rotated features of head_dim {head_dim}; "
                         "they must be even and at most head_dim")
    return dims


class Phi3Family(Family):
    """Phi-3 and its successors (see the module docstring)."""

    name = "phi3"
    hf_model_types = ("phi3",)
    gguf_architectures = ("phi3",)
    gguf_setting_tensors = ("rope_factors_long.weight", "rope_factors_short.weight")

    def config_from_hf(self, hf: HFConfig) -> Phi3Config:
        """Phi3 ``config.json``: SiLU only; partial RoPE; RoPE scaling none,
        linear or longrope. Its ``sliding_window`` is ignored, as Hugging
        Face's and mlx-lm's Phi3 code ignore it (Phi-3-mini declares 2047
        but is run with full attention)."""
        hf.choice("hidden_act", ("silu",), "silu")
        fields = hf.common()
        hidden, heads = fields["hidden_size"], fields["num_heads"]
        if hidden % heads or fields["head_dim"] != hidden // heads:
            raise ModelError(f"config.json: hidden_size {hidden} / num_attention_heads {heads} "
                             f"must be a whole head_dim (the phi3 family derives it), got "
                             f"head_dim {fields['head_dim']}")
        factor = hf.number("partial_rotary_factor", 1.0)
        dims = _rope_dims(fields["head_dim"], int(fields["head_dim"] * factor),
                          f"config.json: partial_rotary_factor {factor}")
        rope = dict(rope_dims=dims, **self._rope_scaling_from_hf(hf, fields, dims))
        return Phi3Config(**fields, family=self.name, **rope)

    def _rope_scaling_from_hf(self, hf: HFConfig, fields: dict[str, Any], dims: int
                              ) -> dict[str, Any]:
        """The :class:`Phi3Config` fields of the RoPE scaling
        (:meth:`~.base.HFConfig.rope_scaling`)."""
        scaling = hf.rope_scaling()
        if not scaling:
            return {}
        if not isinstance(scaling, dict):
            raise ModelError(f"config.json: rope_scaling must be an object, got {scaling!r}")
        kind = scaling.get("type", scaling.get("rope_type"))
        if kind == "linear":
            factor = scaling.get("factor")
            if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
                raise ModelError("config.json: rope_scaling factor must be a positive number, "
                                 f"got {factor!r}")
            return dict(rope_scale=1.0 / factor)
        if kind in ("longrope", "su"):
            if "long_factor" not in scaling:
                raise ModelError(f"config.json: rope_scaling of type {kind!r} lacks long_factor")
            freqs, scale = _longrope(
                fields["rope_theta"], dims, scaling["long_factor"], fields["context_length"],
                hf.integer("original_max_position_embeddings", 4096),
                # Hugging Face's override of the default scale (mlx-lm ignores it).
                scaling.get("attention_factor"),
                ("config.json: rope_scaling long_factor",
                 "config.json: original_max_position_embeddings",
                 "config.json: rope_scaling attention_factor"))
            return dict(rotary_freqs=freqs, rotated_scale=scale)
        raise ModelError(f"config.json: rope_scaling type {kind!r} is not supported by the "
                         "phi3 family (supported: linear, longrope, su)")

    def config_from_gguf(self, gguf: GGUFMetadata) -> Phi3Config:
        """Phi3 GGUF metadata: ``rope.dimension_count`` rotated features;
        longrope from the ``rope_factors_long`` tensor (the short factors
        are not used, see the module docstring), or linear scaling. The
        ``attention.sliding_window`` key is ignored as in
        :meth:`config_from_hf`."""
        fields = gguf.common()
        dims = _rope_dims(fields["head_dim"],
                          gguf.integer("rope.dimension_count", fields["head_dim"]),
                          f"GGUF metadata: {gguf.architecture}.rope.dimension_count")
        rope: dict[str, Any] = dict(rope_dims=dims, rope_scale=gguf.linear_rope_scale())
        long_factor = gguf.setting_tensors.get("rope_factors_long.weight")
        if long_factor is not None:
            rope["rotary_freqs"], rope["rotated_scale"] = _longrope(
                fields["rope_theta"], dims, long_factor.astype(mx.float32).tolist(),
                fields["context_length"], gguf.integer("rope.scaling.original_context_length"),
                gguf.number("rope.scaling.attn_factor", None),
                ("GGUF tensor rope_factors_long.weight",
                 f"GGUF metadata: {gguf.architecture}.rope.scaling.original_context_length",
                 f"GGUF metadata: {gguf.architecture}.rope.scaling.attn_factor"))
        return Phi3Config(**fields, family=self.name, rope_traditional=False, **rope)

    def weights(self, config: ModelConfig) -> tuple[Weight, ...]:
        """The llama layout with q/k/v and gate/up read from the fused tensors."""
        return _WEIGHTS


class Phi3Decoder(LlamaDecoder):
    """The llama forward pass with phi3's partial, possibly longrope-scaled,
    RoPE."""

    c: Phi3Config

    @property
    def fused_attention(self) -> bool:
        """Whether the fused attention block and whole-layer op may be used:
        they take the rotated dims and periods, but have no rotated-feature
        scale."""
        return self.c.rotated_scale == 1.0

    def rope_settings(self, i: int) -> dict[str, Any]:
        """Every layer's RoPE: the rotated dims, their periods and scale."""
        c = self.c
        return dict(dims=c.rope_dims, freqs=c.rotary_freqs, rotated_scale=c.rotated_scale)

    def rope_attributes(self) -> dict[str, Any]:
        """The fused ops' RoPE attributes, over the rotated dims."""
        return dict(super().rope_attributes(), rope_dims=self.c.rope_dims,
                    freqs=self.c.rotary_freqs is not None)

    def rope_freqs_operand(self, sb) -> list[Value]:
        """The fused ops' freqs operand (the rotated dims' periods), if any."""
        freqs = self.c.rotary_freqs
        return [] if freqs is None else [sb.constant(list(freqs), "float32")]


Phi3Family.decoder = Phi3Decoder
FAMILY = Phi3Family()
