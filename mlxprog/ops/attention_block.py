"""A llama-style attention block after its fused q/k/v projection as one op,
``kv_cache_attention_block``: heads, RoPE, the KV-cache writes and the
attention over the cache, float or quantized (``kv_bits``).

On the CPU with native kernels it is one MLX graph node instead of about
eight; elsewhere it runs the ops it is defined by (``fast_rope``, then
``kv_cache_sdpa_update`` or ``quantized_kv_cache_sdpa_update``).
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import mlx.core as mx
from pydantic import Field, model_validator

from ..arrays import AVal, is_floating
from ..cache_kinds import CacheKind, Geometry, cache_kind
from ..native import kernels as native
from .attention import _check_key_mask, _check_operand_count
from .attrs import Attrs, PositiveSize
from .index import clamp_integer
from .positions import _check_offset, _int32_positions
from .quantized_attention import CacheSettings, KVBits, KVGroupSize
from .registry import lookup, register_op


class KVCacheAttentionBlockAttrs(CacheSettings, Attrs):
    """The attributes of ``kv_cache_attention_block``."""

    heads: PositiveSize
    kv_heads: PositiveSize
    rope_dims: PositiveSize | None = None  # None: the head dim
    traditional: bool = False
    base: Annotated[float, Field(gt=0)] = 10000.0
    rope_scale: float = 1.0
    freqs: bool = False  # a freqs [rope_dims / 2] operand instead of base
    scale: float | None = None
    kv_bits: KVBits | None = None
    """Keys and values cached quantized with codes this wide (None: float):
    the cache is then six operands, as ``quantized_kv_cache_sdpa_update``
    takes, in place of k_cache and v_cache."""
    kv_group_size: KVGroupSize = 64
    """The quantized cache's features per scale and bias (with ``kv_bits``)."""
    kv_hadamard: bool = False
    """The quantized cache holds each group's Walsh-Hadamard transform (as
    ``quantized_kv_cache_sdpa_update`` with ``hadamard``; with ``kv_bits``)."""
    kv_recent: PositiveSize | None = None
    """The quantized cache's recent ring of this many tokens (as
    ``quantized_kv_cache_sdpa_update`` with ``recent``; with ``kv_bits``):
    three more cache operands and results, ``k_recent, v_recent,
    recent_slots``."""
    qk_norm_eps: Annotated[float, Field(ge=0)] | None = None
    """With a value, each q and k head is RMS-normed over its D features by
    the ``q_norm`` and ``k_norm`` operands (``[D]``), with this eps, before
    RoPE (Qwen3's per-head norms); None: no such norms."""

    @model_validator(mode="after")
    def _heads_in_groups(self):
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        if self.rope_dims is not None and self.rope_dims % 2:
            raise ValueError(f"rope_dims must be even, found {self.rope_dims}")
        for setting in ("kv_hadamard", "kv_recent"):
            if getattr(self, setting) and self.kv_bits is None:
                raise ValueError(f"{setting} is a setting of the quantized cache: give kv_bits "
                                 "too")
        return self

    RING_SIZE: ClassVar[str] = "kv_recent"

    def cache_kind(self) -> CacheKind:
        """The kind of cache these attributes give."""
        return cache_kind(self.kv_bits, self.kv_group_size, self.kv_hadamard)


def _block_operand_names(avals: list, attrs: KVCacheAttentionBlockAttrs) -> list[str]:
    """The operand names of a ``kv_cache_attention_block`` with these attributes
    (the key mask is there when one more operand is)."""
    names = ["qkv", *attrs.cache_names(), "offset", "positions", *block_tail(attrs)]
    return names + (["key_mask"] if len(avals) > len(names) else [])


#: The per-head norms' operands, where ``qk_norm_eps`` is set.
QK_NORMS = ("q_norm", "k_norm")


def block_tail(attrs: KVCacheAttentionBlockAttrs) -> list[str]:
    """The operand names after positions and before the optional key mask
    (an attention block's, or a whole layer's): freqs and the q/k norms,
    where the attributes ask for them."""
    return (["freqs"] if attrs.freqs else []) + (
        list(QK_NORMS) if attrs.qk_norm_eps is not None else [])


def qk_norm_weights(named: dict[str, mx.array], attrs: KVCacheAttentionBlockAttrs,
                    dtype) -> list[mx.array] | None:
    """The q and k norm weights among ``named`` operands, cast to ``dtype``,
    or None without ``qk_norm_eps``."""
    if attrs.qk_norm_eps is None:
        return None
    return [named[n].astype(dtype) for n in QK_NORMS]


def check_cache(named: dict[str, AVal], attrs: KVCacheAttentionBlockAttrs) -> Geometry:
    """The cache operands of a block (or layer) with these attributes:
    ``(B, kv_heads, S, D)``; ValueError names what does not fit."""
    kind = attrs.cache_kind()
    geometry = kind.fit([named[n] for n in kind.operand_names()])
    if geometry[1] != attrs.kv_heads:
        raise ValueError(f"the caches hold {geometry[1]} heads, attribute kv_heads is "
                         f"{attrs.kv_heads}")
    if attrs.kv_recent:
        attrs.ring().check(named, geometry)
    return geometry


def _check_kv_cache_attention_block(avals: list[AVal], attrs: KVCacheAttentionBlockAttrs) -> None:
    """qkv ``[B, T, (heads + 2 kv_heads) D]`` and caches ``[B, kv_heads, S,
    D]`` of qkv's float dtype (or a quantized cache of that head dim and
    float32 qkv), T <= S; integer offset and positions, the freqs and key
    mask where present."""
    names = _block_operand_names(avals, attrs)
    _check_operand_count(avals, names, "kv_cache_attention_block"
                         + (" with freqs" if attrs.freqs else "")
                         + (" with qk_norm_eps" if attrs.qk_norm_eps is not None else "")
                         + (" with kv_bits" if attrs.kv_bits is not None else "")
                         + (" with kv_recent" if attrs.kv_recent else ""))
    ops = dict(zip(names, avals))
    qkv = ops["qkv"]
    B, _, S, D = check_cache(ops, attrs)
    width = (attrs.heads + 2 * attrs.kv_heads) * D
    if len(qkv.shape) != 3 or qkv.shape[0] != B or qkv.shape[2] != width:
        raise ValueError(f"qkv must be [{B}, T, {width}] ((heads + 2 kv_heads) x {D}, the "
                         f"caches' head dim), found {qkv}")
    kind = attrs.cache_kind()
    first = ops[kind.operand_names()[0]]
    if kind.quantized:
        if qkv.dtype != mx.float32:
            raise ValueError(f"qkv must be float32 with a quantized cache, found {qkv}")
    elif qkv.dtype != first.dtype or not is_floating(qkv.dtype):
        raise ValueError(f"qkv and the caches must have one float dtype; found {qkv} and "
                         f"{first}")
    if qkv.shape[1] > S:
        raise ValueError(f"{qkv.shape[1]} new tokens do not fit a cache of {S}")
    dims = attrs.rope_dims or D
    if dims > D:
        raise ValueError(f"rope_dims {dims} exceeds the head dim {D}")
    _check_offset(ops["offset"], "offset")
    _check_offset(ops["positions"], "positions", ((), (1,), (B,)))
    if "freqs" in ops and ops["freqs"].shape != (dims // 2,):
        raise ValueError(f"freqs must be [{dims // 2}] (rope_dims / 2), found {ops['freqs']}")
    for norm in QK_NORMS:
        if norm in ops and (ops[norm].shape != (D,) or not is_floating(ops[norm].dtype)):
            raise ValueError(f"{norm} must be a float [{D}] (the caches' head dim), found "
                             f"{ops[norm]}")
    if "key_mask" in ops:
        _check_key_mask(ops["key_mask"], B, S)


def _native_kv_cache_attention_block(avals, attrs: KVCacheAttentionBlockAttrs) -> bool:
    """Whether the native attention-block kernel computes this instruction."""
    named = dict(zip(_block_operand_names(avals, attrs), avals))
    cache, ring = attrs.split_cache([named[n] for n in attrs.cache_names()])
    return native.covers_cache_attention_block(named["qkv"], cache, attrs.cache_kind(),
                                               recent=ring)


@register_op("kv_cache_attention_block", attrs=KVCacheAttentionBlockAttrs, operands=(5, 16),
             outputs=lambda attrs, n: 1 + len(attrs.cache_names()),
             check=_check_kv_cache_attention_block,
             native_coverage=_native_kv_cache_attention_block, context=True)
def kv_cache_attention_block(operands, attrs, context):
    """A llama-style attention block after its fused q/k/v projection, as one
    op: split ``qkv`` ``[B, T, (heads + 2 kv_heads) D]`` (token-major, q heads,
    then k heads, then v heads) into heads, rotate q and k (``fast_rope``:
    the first ``rope_dims`` features, frequencies ``base ** (-2i /
    rope_dims)`` or the ``freqs`` operand, ``traditional`` pairs, token t of
    example b at ``(positions[b] + t) * rope_scale``), then
    ``kv_cache_sdpa_update`` in the ``BHTD`` layout: write k and v into the
    caches ``[B, kv_heads, S, D]`` at ``offset`` (clamped to ``[0, S - T]``)
    and attend, query t seeing key j when ``j <= offset + t`` and
    ``key_mask[b, j]``. Results: the attention output ``[B, T, heads * D]``
    (token-major, ready for the output projection), then the new cache.

    With ``qk_norm_eps`` set, each q and k head is first RMS-normed over its
    D features (``fast_rms_norm`` by ``q_norm`` or ``k_norm``, cast to qkv's
    dtype, with that eps), as Qwen3 does before RoPE.

    Operands: qkv, k_cache, v_cache, offset (an integer scalar), positions
    (an integer scalar or ``[B]``), freqs ``[rope_dims / 2]`` when
    ``freqs=true``, q_norm and k_norm ``[D]`` when ``qk_norm_eps`` is set,
    and an optional key_mask ``[B, S]``. With ``kv_bits``
    (4 or 8) the cache is quantized: six operands ``k_values, k_scales,
    k_biases, v_values, v_scales, v_biases`` in place of k_cache and v_cache
    (as ``quantized_kv_cache_sdpa_update`` takes, whose rule, with
    ``hadamard`` as ``kv_hadamard`` says, then replaces
    ``kv_cache_sdpa_update``'s; qkv float32), and six new cache arrays in
    the results; with ``kv_recent`` too the recent ring's three arrays
    after them, in the operands and the results (``recent`` of
    ``quantized_kv_cache_sdpa_update``). On the CPU with native kernels
    (float32) it is one graph node instead of about eight."""
    named = dict(zip(_block_operand_names(operands, attrs), operands))
    qkv = named["qkv"]
    caches = [named[n] for n in attrs.cache_names()]
    kind = attrs.cache_kind()
    B, T, _ = qkv.shape
    S, D = caches[0].shape[2], kind.head_dim(caches[0].shape[3])
    dims = attrs.rope_dims or D
    start = clamp_integer(named["offset"].reshape(1), 0, S - T, mx.int32)
    positions = _int32_positions(named["positions"].reshape(-1))
    freqs, key_mask = named.get("freqs"), named.get("key_mask")
    scale = attrs.scale if attrs.scale is not None else D ** -0.5
    cache, ring = attrs.split_cache(caches)
    qk_norm = qk_norm_weights(named, attrs, qkv.dtype)
    out = native.cache_attention_block(
        context.native, qkv, cache, start, positions, heads=attrs.heads,
        kv_heads=attrs.kv_heads, dims=dims, traditional=attrs.traditional, base=attrs.base,
        rope_scale=attrs.rope_scale, scale=scale, freqs=freqs, key_mask=key_mask, kind=kind,
        recent=ring, qk_norm=qk_norm, qk_norm_eps=attrs.qk_norm_eps or 0.0)
    if out is not None:
        return tuple(out)
    heads = qkv.reshape(B, T, attrs.heads + 2 * attrs.kv_heads, D).transpose(0, 2, 1, 3)
    q, k, v = mx.split(heads, [attrs.heads, attrs.heads + attrs.kv_heads], axis=1)
    if qk_norm is not None:
        q, k = (mx.fast.rms_norm(a, w, attrs.qk_norm_eps) for a, w in zip((q, k), qk_norm))
    rope = dict(traditional=attrs.traditional, scale=attrs.rope_scale, offset=positions)
    if freqs is None:
        q, k = (mx.fast.rope(a, dims, base=attrs.base, **rope) for a in (q, k))
    else:
        q, k = (mx.fast.rope(a, dims, base=None, freqs=freqs, **rope) for a in (q, k))
    masked = [key_mask] if key_mask is not None else []
    name, kind_attrs = kind.sdpa_op(attrs.ring())
    sdpa = lookup(name)
    out, *caches = sdpa.apply([q, k, v, *caches, start, *masked],
                              sdpa.attrs(scale=scale, **kind_attrs), context)
    return (out.transpose(0, 2, 1, 3).reshape(B, T, attrs.heads * D), *caches)
