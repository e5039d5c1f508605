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

from pydantic import field_validator

from ..arrays import AVal, is_floating, name_of
from ..ggml import types as ggml_types
from ..native import kernels as native
from .activations import fast_swiglu
from .attention import _check_operand_count
from .attention_block import (
    KVCacheAttentionBlockAttrs,
    _check_kv_cache_attention_block,
    block_tail,
    check_cache,
    kv_cache_attention_block,
    qk_norm_weights,
)
from .ggml import GGMLMatmulAttrs, ggml_matmul
from .index import clamp_integer
from .norms import NonNegativeFloat, NormAttrs, fast_add_rms_norm, fast_rms_norm
from .positions import _int32_positions
from .quant import Numerics, QuantizedMatmulAttrs, quantized_matmul
from .registry import register_op

PROJECTIONS = ("qkv", "o", "gate_up", "down")
"""The layer's quantized projections, in operand order (each ``w``,
``scales``, ``biases``, or with ``ggml_parts`` one ``w`` per part; ``w``
stored ``[out, in]``)."""

#: Each projection's parts by output rows, at most (q, k, v; gate, up).
_MAX_PARTS = {"qkv": 3, "o": 1, "gate_up": 2, "down": 1}

GGMLParts = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]


class TransformerLayerAttrs(KVCacheAttentionBlockAttrs):
    """The attributes of ``transformer_layer``: the attention block's, the
    norms' ``eps``, and the projections' quantization (one for all four) and
    numerics."""

    eps: NonNegativeFloat = 1e-5
    group_size: Literal[32, 64, 128] = 64
    bits: Literal[1, 2, 3, 4, 5, 6, 8] = 4
    numerics: Numerics = "exact"
    #: The projections in GGUF's own blocks (``ggml_matmul``'s): for qkv,
    #: o, gate_up and down, the GGML block type of each part, the parts
    #: stacked by output rows (q, k, v; gate, up; one part where the
    #: projection is stored whole). None: MLX's affine projections
    #: (``group_size``, ``bits``).
    ggml_parts: GGMLParts | None = None

    @field_validator("ggml_parts")
    @classmethod
    def _known_parts(cls, parts: GGMLParts | None) -> GGMLParts | None:
        if parts is None:
            return None
        for name, types in zip(PROJECTIONS, parts):
            if not 1 <= len(types) <= _MAX_PARTS[name]:
                raise ValueError(f"ggml_parts: {name} has 1 to {_MAX_PARTS[name]} parts, "
                                 f"found {len(types)}")
            for t in types:
                if t not in ggml_types.BLOCK_TYPES:
                    raise ValueError(f"ggml_parts: {name}'s {t!r} is not a GGML block type "
                                     f"({', '.join(ggml_types.BLOCK_TYPES)})")
        return parts

    def projection_operands(self) -> dict[str, list[str]]:
        """Each projection's operand names, in order."""
        if self.ggml_parts is None:
            return {p: [f"{p}_{part}" for part in ("w", "scales", "biases")]
                    for p in PROJECTIONS}
        return {p: [f"{p}_w{i}" for i in range(len(types))]
                for p, types in zip(PROJECTIONS, self.ggml_parts)}

    def before_caches(self) -> list[str]:
        """The operand names before the cache's."""
        ops = self.projection_operands()
        return ["h", "input_norm", *ops["qkv"], *ops["o"], "post_norm", *ops["gate_up"],
                *ops["down"]]

    def operand_names(self, count: int) -> list[str]:
        """The operand names of an instruction with ``count`` operands (the
        key mask is there when one more operand is)."""
        names = [*self.before_caches(), *self.cache_names(), "offset", "positions",
                 *block_tail(self)]
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
    """Projection ``name`` maps ``features`` inputs to ``rows`` outputs (see
    :func:`_check_affine_projection` and :func:`_check_ggml_projection`)."""
    if attrs.ggml_parts is None:
        _check_affine_projection(named, name, rows, features, attrs)
    else:
        _check_ggml_projection(named, name, rows, features, attrs)


def _check_ggml_projection(named: dict[str, AVal], name: str, rows: int, features: int,
                           attrs: TransformerLayerAttrs) -> None:
    """Each part of projection ``name`` is uint8 ``[part rows, row_bytes]``
    of its GGML type for ``features`` inputs, the parts' rows adding up to
    ``rows`` (gate_up's two parts each half of them)."""
    types = attrs.ggml_parts[PROJECTIONS.index(name)]
    total = 0
    for i, type_name in enumerate(types):
        t, w = ggml_types.BY_NAME[type_name], named[f"{name}_w{i}"]
        if features % t.block:
            raise ValueError(f"{name} takes {features} features, which do not split into "
                             f"{type_name} blocks of {t.block}")
        if w.dtype != mx.uint8 or len(w.shape) != 2 or w.shape[1] != t.row_bytes(features):
            raise ValueError(f"{name}_w{i} must be uint8 [rows, {t.row_bytes(features)}] "
                             f"({features} {type_name} values a row), found {w}")
        if name == "gate_up" and len(types) == 2 and w.shape[0] * 2 != rows:
            raise ValueError(f"gate_up's parts are the gate and up halves of {rows} rows, "
                             f"found {name}_w{i} {w}")
        total += w.shape[0]
    if total != rows:
        raise ValueError(f"{name}'s parts hold {total} rows, expected {rows}")


def _check_affine_projection(named: dict[str, AVal], name: str, rows: int, features: int,
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
                         + (" with freqs" if attrs.freqs else "")
                         + (" with qk_norm_eps" if attrs.qk_norm_eps is not None else ""))
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
    # The weights among gate_up's operands: its w, or each part's.
    weights = [n for n in attrs.projection_operands()["gate_up"] if "_w" in n]
    gate_up_rows = sum(named[n].shape[0] if named[n].shape else 0 for n in weights)
    if gate_up_rows % 2 or not gate_up_rows:
        raise ValueError(f"{' + '.join(weights)}'s rows hold the gate, then up: an even, "
                         f"nonzero count, found {', '.join(str(named[n]) for n in weights)}")
    width = gate_up_rows // 2
    attention = attrs.heads * head_dim
    _check_projection(named, "qkv", (attrs.heads + 2 * attrs.kv_heads) * head_dim, hidden, attrs)
    _check_projection(named, "o", hidden, attention, attrs)
    _check_projection(named, "gate_up", 2 * width, hidden, attrs)
    _check_projection(named, "down", hidden, width, attrs)
    qkv = AVal((h.shape[0], h.shape[1], (attrs.heads + 2 * attrs.kv_heads) * head_dim), h.dtype)
    _check_kv_cache_attention_block([qkv] + avals[len(attrs.before_caches()):],
                                    attrs.block_attrs())


def _projections(named: dict, attrs: TransformerLayerAttrs) -> dict[str, list]:
    """Each projection's arrays, by name: its (w, scales, biases), or with
    ``ggml_parts`` its parts' weights."""
    return {p: [named[n] for n in names] for p, names in attrs.projection_operands().items()}


def _native_transformer_layer(avals, attrs: TransformerLayerAttrs) -> bool:
    """Whether the native layer kernel computes this instruction."""
    named = dict(zip(attrs.operand_names(len(avals)), avals))
    cache, ring = attrs.split_cache([named[n] for n in attrs.cache_names()])
    return not native.transformer_layer_uncovered_reason(
        named["h"], named["input_norm"], named["post_norm"], _projections(named, attrs), cache,
        group_size=attrs.group_size, bits=attrs.bits, numerics=attrs.numerics,
        ggml_parts=attrs.ggml_parts, kind=attrs.cache_kind(), recent=ring)


@register_op("transformer_layer", attrs=TransformerLayerAttrs, operands=(11, 30),
             outputs=lambda attrs, n: 1 + len(attrs.cache_names()),
             check=_check_transformer_layer, native_coverage=_native_transformer_layer,
             context=True)
def transformer_layer(operands, attrs, context):
    """A llama-style decoder layer on the hidden states ``h`` ``[B, T,
    hidden]``. Results: the layer's output hidden states ``[B, T, hidden]``,
    then the new cache (k_cache and v_cache, or with ``kv_bits`` the
    quantized cache's six arrays). It computes, with ``qmm`` being
    ``quantized_matmul`` (``transpose``, the ``group_size``, ``bits`` and
    ``numerics`` attributes; with ``ggml_parts``, ``ggml_matmul`` of each
    part, the parts' results joined along the last axis):

    1. ``x = fast_rms_norm(h, input_norm)``;
    2. ``attn, *cache = kv_cache_attention_block(qmm(x, qkv), *cache, offset,
       positions[, freqs][, q_norm, k_norm][, key_mask])`` (the attention
       attributes, the cache's ``kv_bits`` and ``kv_group_size`` and the
       per-head norms' ``qk_norm_eps`` too, are that op's);
    3. ``h = h + qmm(attn, o)``, ``x = fast_rms_norm(h, post_norm)``;
    4. result ``h + qmm(fast_swiglu(qmm(x, gate_up)), down)``, gate_up's
       rows being the gate's, then up's.

    Operands: h, input_norm ``[hidden]``, qkv_w, qkv_scales, qkv_biases
    (``[(heads + 2 kv_heads) D, ...]``), o_w, o_scales, o_biases, post_norm,
    gate_up_w, gate_up_scales, gate_up_biases (``[2 I, ...]``), down_w,
    down_scales, down_biases (with ``ggml_parts``: qkv_w0, qkv_w1, ..., o_w0,
    post_norm, gate_up_w0, ..., down_w0, each part's GGML blocks ``uint8
    [rows, row_bytes]``), then the attention block's k_cache, v_cache
    ``[B, kv_heads, S, D]`` (or its quantized cache's six arrays, and with
    ``kv_recent`` its recent ring's three; the results likewise), offset,
    positions, freqs (with ``freqs=true``), q_norm and k_norm ``[D]`` (with
    ``qk_norm_eps``) and an optional key_mask. The norm weights are cast to
    h's dtype.

    On the CPU with native kernels (float32 h and caches, or a quantized
    cache; ``numerics="int8"`` needs 4- or 8-bit affine codes or GGML
    parts) the layer is one
    graph node; elsewhere the ops
    above run one by one (an int8 choice that cannot be honoured is counted
    in ``exe.stats.numerics_fallbacks`` by the matmuls)."""
    named = dict(zip(attrs.operand_names(len(operands)), operands))
    h = named["h"]
    caches = [named[n] for n in attrs.cache_names()]
    kind = attrs.cache_kind()
    T, S, D = h.shape[1], caches[0].shape[2], kind.head_dim(caches[0].shape[3])
    projections = _projections(named, attrs)
    positions = named["positions"]
    cache, ring = attrs.split_cache(caches)
    qk_norm = qk_norm_weights(named, attrs, h.dtype)
    result = native.transformer_layer(
        context.native, h, named["input_norm"], named["post_norm"], projections, cache,
        start=clamp_integer(named["offset"], 0, S - T, mx.int32),
        positions=_int32_positions(positions if positions.ndim == 1 else positions.reshape(-1)),
        heads=attrs.heads, kv_heads=attrs.kv_heads, dims=attrs.rope_dims or D,
        traditional=attrs.traditional, base=attrs.base, rope_scale=attrs.rope_scale,
        scale=attrs.scale if attrs.scale is not None else D ** -0.5,
        eps=attrs.eps, group_size=attrs.group_size, bits=attrs.bits, numerics=attrs.numerics,
        ggml_parts=attrs.ggml_parts, freqs=named.get("freqs"), key_mask=named.get("key_mask"),
        kind=kind, recent=ring, qk_norm=qk_norm, qk_norm_eps=attrs.qk_norm_eps or 0.0)
    if result is not None:
        return tuple(result)
    norm, matmul = NormAttrs(eps=attrs.eps), attrs.matmul_attrs()

    def qmm(x, name):
        if attrs.ggml_parts is None:
            return quantized_matmul([x, *projections[name]], matmul, context)
        types = attrs.ggml_parts[PROJECTIONS.index(name)]
        parts = [ggml_matmul([x, w], GGMLMatmulAttrs(type=t, numerics=attrs.numerics), context)
                 for t, w in zip(types, projections[name])]
        return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1)

    x = fast_rms_norm([h, named["input_norm"].astype(h.dtype)], norm, context)
    block = [qmm(x, "qkv")] + operands[len(attrs.before_caches()):]
    attn, *caches = kv_cache_attention_block(block, attrs.block_attrs(), context)
    h, x = fast_add_rms_norm([h, qmm(attn, "o"), named["post_norm"].astype(h.dtype)], norm,
                             context)
    return (h + qmm(fast_swiglu([qmm(x, "gate_up")], None, context), "down"), *caches)
