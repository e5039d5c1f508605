"""Whole transformer layers as one op: ``transformer_layer``, a llama-style
decoder layer (pre-norm attention over a KV cache and a SwiGLU MLP, each
added to the residual) on quantized projections.

The op is defined by the ops it is made of (``fast_rms_norm``,
``quantized_matmul``, ``kv_cache_attention_block``, ``fast_add_rms_norm``,
``fast_swiglu``) and computes exactly what they compute. It exists for the
CPU: there, with native kernels, the layer is one MLX graph node instead of
about eight, and a decode step's host cost (building and dispatching the
graph, microseconds per node on a core the kernels need) falls with the
node count. Elsewhere it runs those ops one by one.
"""

from __future__ import annotations

from typing import Literal

import mlx.core as mx

from ..arrays import AVal, is_floating, name_of
from ..native import kernels as native
from .activations import fast_swiglu
from .attention import _check_operand_count
from .attention_block import (
    KVCacheAttentionBlockAttrs,
    _check_kv_cache_attention_block,
    check_cache,
    head_dim,
    kv_cache_attention_block,
)
from .index import clamp_integer
from .norms import NonNegativeFloat, NormAttrs, fast_add_rms_norm, fast_rms_norm
from .positions import _int32_positions
from .quant import Numerics, QuantizedMatmulAttrs, quantized_matmul
from .registry import register_op

PROJECTIONS = ("qkv", "o", "gate_up", "down")
"""The layer's quantized projections, in operand order (each ``w``,
``scales``, ``biases``; ``w`` stored ``[out, in]``)."""

_BEFORE_CACHES = ("h", "input_norm", "qkv_w", "qkv_scales", "qkv_biases", "o_w", "o_scales",
                  "o_biases", "post_norm", "gate_up_w", "gate_up_scales", "gate_up_biases",
                  "down_w", "down_scales", "down_biases")


class TransformerLayerAttrs(KVCacheAttentionBlockAttrs):
    """The attributes of ``transformer_layer``: the attention block's, the
    norms' ``eps``, and the projections' quantization (one for all four) and
    numerics."""

    eps: NonNegativeFloat = 1e-5
    group_size: Literal[32, 64, 128] = 64
    bits: Literal[1, 2, 3, 4, 5, 6, 8] = 4
    numerics: Numerics = "exact"

    def operand_names(self, count: int) -> list[str]:
        """The operand names of an instruction with ``count`` operands (the
        key mask is there when one more operand is)."""
        names = [*_BEFORE_CACHES, *self.cache_names(), "offset", "positions"]
        names += ["freqs"] if self.freqs else []
        return names + (["key_mask"] if count > len(names) else [])

    def block_attrs(self) -> KVCacheAttentionBlockAttrs:
        """The attributes of the layer's ``kv_cache_attention_block``."""
        return KVCacheAttentionBlockAttrs(**{name: getattr(self, name)
                                             for name in KVCacheAttentionBlockAttrs.model_fields})

    def matmul_attrs(self) -> QuantizedMatmulAttrs:
        """The attributes of the layer's four ``quantized_matmul``s."""
        return QuantizedMatmulAttrs(group_size=self.group_size, bits=self.bits, transpose=True,
                                    numerics=self.numerics)


def _check_projection(named: dict[str, AVal], name: str, rows: int, features: int,
                      attrs: TransformerLayerAttrs) -> None:
    """Projection ``name`` maps ``features`` inputs to ``rows`` outputs: w
    uint32 ``[rows, features * bits / 32]``, scales and biases ``[rows,
    features / group_size]`` of a float dtype that keeps h's (h float32, or
    the scales of h's dtype: the layer's results stay in h's dtype)."""
    w, scales, biases = (named[f"{name}_{part}"] for part in ("w", "scales", "biases"))
    if features % attrs.group_size or (features * attrs.bits) % 32:
        raise ValueError(f"{name} takes {features} features, which do not split into groups "
                         f"of {attrs.group_size} ({attrs.bits}-bit codes packed in uint32)")
    packed = (rows, features * attrs.bits // 32)
    groups = (rows, features // attrs.group_size)
    if w.dtype != mx.uint32 or w.shape != packed:
        raise ValueError(f"{name}_w must be uint32{list(packed)} ({rows} outputs of {features} "
                         f"{attrs.bits}-bit codes), found {w}")
    for part, aval in (("scales", scales), ("biases", biases)):
        if aval.shape != groups or not is_floating(aval.dtype) or aval.dtype == mx.float64:
            raise ValueError(f"{name}_{part} must be float16, bfloat16 or float32 "
                             f"{list(groups)} (groups of {attrs.group_size}), found {aval}")
        h = named["h"].dtype
        if h != mx.float32 and aval.dtype != h:
            raise ValueError(f"{name}_{part} is {name_of(aval.dtype)}, which would promote the "
                             f"layer's {name_of(h)} h; give it {name_of(h)}, or a float32 h")


def _check_transformer_layer(avals: list[AVal], attrs: TransformerLayerAttrs) -> None:
    """h ``[B, T, hidden]``, norms ``[hidden]``, the four projections'
    shapes from hidden, the heads and the MLP width (gate_up's rows / 2),
    then what ``kv_cache_attention_block`` asks of the caches and the rest."""
    names = attrs.operand_names(len(avals))
    _check_operand_count(avals, names, "transformer_layer"
                         + (" with freqs" if attrs.freqs else ""))
    named = dict(zip(names, avals))
    h = named["h"]
    if len(h.shape) != 3 or not is_floating(h.dtype) or h.dtype == mx.float64:
        raise ValueError(f"h must be a float16, bfloat16 or float32 [B, T, hidden], found {h}")
    hidden = h.shape[2]
    for norm in ("input_norm", "post_norm"):
        if named[norm].shape != (hidden,) or not is_floating(named[norm].dtype):
            raise ValueError(f"{norm} must be a float [{hidden}] (h's last axis), "
                             f"found {named[norm]}")
    head_dim = check_cache(named, attrs)[3]
    gate_up_rows = named["gate_up_w"].shape[0] if named["gate_up_w"].shape else 0
    if gate_up_rows % 2 or not gate_up_rows:
        raise ValueError(f"gate_up_w's rows hold the gate, then up: an even, nonzero count, "
                         f"found {named['gate_up_w']}")
    width = gate_up_rows // 2
    attention = attrs.heads * head_dim
    _check_projection(named, "qkv", (attrs.heads + 2 * attrs.kv_heads) * head_dim, hidden, attrs)
    _check_projection(named, "o", hidden, attention, attrs)
    _check_projection(named, "gate_up", 2 * width, hidden, attrs)
    _check_projection(named, "down", hidden, width, attrs)
    qkv = AVal((h.shape[0], h.shape[1], (attrs.heads + 2 * attrs.kv_heads) * head_dim), h.dtype)
    _check_kv_cache_attention_block([qkv] + avals[len(_BEFORE_CACHES):], attrs.block_attrs())


def _projections(named: dict) -> dict[str, list]:
    """Each projection's (w, scales, biases), by name."""
    return {p: [named[f"{p}_{part}"] for part in ("w", "scales", "biases")]
            for p in PROJECTIONS}


def _native_transformer_layer(avals, attrs: TransformerLayerAttrs) -> bool:
    """Whether the native layer kernel computes this instruction."""
    named = dict(zip(attrs.operand_names(len(avals)), avals))
    cache, ring = attrs.split_cache([named[n] for n in attrs.cache_names()])
    return not native.transformer_layer_uncovered_reason(
        named["h"], named["input_norm"], named["post_norm"], _projections(named), cache,
        group_size=attrs.group_size, bits=attrs.bits, numerics=attrs.numerics,
        **attrs.quantization(), recent=ring)


@register_op("transformer_layer", attrs=TransformerLayerAttrs, operands=(19, 28),
             outputs=lambda attrs, n: 1 + len(attrs.cache_names()),
             check=_check_transformer_layer, native_coverage=_native_transformer_layer,
             context=True)
def transformer_layer(operands, attrs, context):
    """A llama-style decoder layer on the hidden states ``h`` ``[B, T,
    hidden]``. Results: the layer's output hidden states ``[B, T, hidden]``,
    then the new cache (k_cache and v_cache, or with ``kv_bits`` the
    quantized cache's six arrays). It computes, with ``qmm`` being
    ``quantized_matmul`` (``transpose``, the ``group_size``, ``bits`` and
    ``numerics`` attributes):

    1. ``x = fast_rms_norm(h, input_norm)``;
    2. ``attn, *cache = kv_cache_attention_block(qmm(x, qkv), *cache, offset,
       positions[, freqs][, key_mask])`` (the attention attributes, the
       cache's ``kv_bits`` and ``kv_group_size`` too, are that op's);
    3. ``h = h + qmm(attn, o)``, ``x = fast_rms_norm(h, post_norm)``;
    4. result ``h + qmm(fast_swiglu(qmm(x, gate_up)), down)``, gate_up's
       rows being the gate's, then up's.

    Operands: h, input_norm ``[hidden]``, qkv_w, qkv_scales, qkv_biases
    (``[(heads + 2 kv_heads) D, ...]``), o_w, o_scales, o_biases, post_norm,
    gate_up_w, gate_up_scales, gate_up_biases (``[2 I, ...]``), down_w,
    down_scales, down_biases, then the attention block's k_cache, v_cache
    ``[B, kv_heads, S, D]`` (or its quantized cache's six arrays, and with
    ``kv_recent`` its float window's three; the results likewise), offset,
    positions, freqs (with ``freqs=true``) and an optional key_mask. The
    norm weights are cast to h's dtype.

    On the CPU with native kernels (float32 h and caches, or a quantized
    cache; ``numerics="int8"`` needs 4- or 8-bit codes) the layer is one
    graph node; elsewhere the ops
    above run one by one (an int8 choice that cannot be honoured is counted
    in ``exe.stats.numerics_fallbacks`` by the matmuls)."""
    named = dict(zip(attrs.operand_names(len(operands)), operands))
    h = named["h"]
    caches = [named[n] for n in attrs.cache_names()]
    T, S, D = h.shape[1], caches[0].shape[2], head_dim(caches, attrs)
    projections = _projections(named)
    positions = named["positions"]
    cache, ring = attrs.split_cache(caches)
    result = native.transformer_layer(
        context.native, h, named["input_norm"], named["post_norm"], projections, cache,
        start=clamp_integer(named["offset"], 0, S - T, mx.int32),
        positions=_int32_positions(positions if positions.ndim == 1 else positions.reshape(-1)),
        heads=attrs.heads, kv_heads=attrs.kv_heads, dims=attrs.rope_dims or D,
        traditional=attrs.traditional, base=attrs.base, rope_scale=attrs.rope_scale,
        scale=attrs.scale if attrs.scale is not None else D ** -0.5,
        eps=attrs.eps, group_size=attrs.group_size, bits=attrs.bits, numerics=attrs.numerics,
        freqs=named.get("freqs"), key_mask=named.get("key_mask"), **attrs.quantization(),
        kv_hadamard=attrs.kv_hadamard, recent=ring)
    if result is not None:
        return tuple(result)
    norm, matmul = NormAttrs(eps=attrs.eps), attrs.matmul_attrs()

    def qmm(x, name):
        return quantized_matmul([x, *projections[name]], matmul, context)

    x = fast_rms_norm([h, named["input_norm"].astype(h.dtype)], norm, context)
    block = [qmm(x, "qkv")] + operands[len(_BEFORE_CACHES):]
    attn, *caches = kv_cache_attention_block(block, attrs.block_attrs(), context)
    h, x = fast_add_rms_norm([h, qmm(attn, "o"), named["post_norm"].astype(h.dtype)], norm,
                             context)
    return (h + qmm(fast_swiglu([qmm(x, "gate_up")], None, context), "down"), *caches)
