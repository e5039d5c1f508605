"""Attention over a quantized KV cache: keys and values stored as MLX's
affine quantization (packed codes, one scale and one bias per group of
``group_size`` features), written and read without ever holding the cache
in floats.

The cache is an :class:`~mlxprog.cache_kinds.AffineCache`: six arrays per
layer, ``k_values``, ``k_scales``, ``k_biases`` and the values' three (see
:mod:`mlxprog.cache_kinds`, which names and checks them for this op,
``kv_cache_attention_block`` and ``transformer_layer``). With ``hadamard``
the cache holds the quantization of each group's Walsh-Hadamard transform.

With a recent ring of ``recent`` tokens (:class:`~mlxprog.cache_kinds.RecentRing`),
each query reads the keys and values of the last ``recent`` slots up to
its own unrounded: the step's own new ones, or those the ring's three more
arrays per layer keep from earlier steps (``k_recent``, ``v_recent``,
``recent_slots``). An entry whose slot no longer matches (its slot
rewritten since, as after a speculative step's rejected tokens) is not
read, so a host that moves a cache's slots must move the entries with them
(the ring turned and the slots changed by as much) or set their slots to
-1. The most recent keys carry most of a query's attention: SmolLM2's
perplexity with 4-bit keys and values moves by +0.3% instead of +6.2% (the
mean of four texts; docs/llm.md, "KV cache").
"""

from __future__ import annotations

import itertools
from typing import Annotated, ClassVar, Literal, NamedTuple

import mlx.core as mx
from pydantic import Field

from ..arrays import AVal
from ..cache_kinds import (AFFINE_BITS, AFFINE_GROUP_SIZES, AffineCache, CacheKind, RecentRing,
                           hadamard_groups)
from ..native import kernels as native
from .attention import (_causal_keep, _check_attention, _check_key_mask, _check_operand_count,
                        _check_sinks)
from .attrs import Attrs, PositiveSize
from .index import clamp_integer
from .positions import _check_offset
from .registry import register_op

#: The code widths and group sizes a quantized cache takes.
KVBits = Literal[AFFINE_BITS]
KVGroupSize = Literal[AFFINE_GROUP_SIZES]


class CacheSettings:
    """What the attributes of an op over a KV cache say of its cache (a
    mixin of their :class:`~mlxprog.ops.attrs.Attrs`): the kind
    (:meth:`cache_kind`) and the recent ring's size (the attribute
    :attr:`RING_SIZE` names)."""

    #: The attribute holding the recent ring's size (None: no ring).
    RING_SIZE: ClassVar[str]

    def cache_kind(self) -> CacheKind:
        """The kind of cache the attributes give."""
        raise NotImplementedError

    def ring(self) -> RecentRing | None:
        """The recent ring, if any."""
        size = getattr(self, self.RING_SIZE)
        return RecentRing(size) if size else None

    def cache_names(self) -> list[str]:
        """The cache's operand names (and the results after the first), the
        recent ring's included."""
        return self.cache_kind().operand_names() + (list(RecentRing.NAMES) if self.ring()
                                                    else [])

    def split_cache(self, values: list) -> tuple[list, list | None]:
        """The cache's arrays (or avals) in :meth:`cache_names` order as
        (the cache's, the recent ring's or None), as the native kernels take
        them."""
        if self.ring() is None:
            return values, None
        return values[:-len(RecentRing.NAMES)], values[-len(RecentRing.NAMES):]


class QuantizedKVCacheSdpaAttrs(CacheSettings, Attrs):
    """The attributes of ``quantized_kv_cache_sdpa_update``."""

    bits: KVBits
    group_size: KVGroupSize
    hadamard: bool = False
    """The cache holds each group's Walsh-Hadamard transform (see the module
    docstring), quantized."""
    scale: float | None = None
    softcap: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    """Cap the attention scores at ``softcap * tanh(score / softcap)``."""
    window: PositiveSize | None = None
    """Sliding-window attention: a query sees only the last ``window`` slots up
    to and including its own."""
    recent: PositiveSize | None = None
    """A recent ring of this many tokens (see the module docstring): three
    more operands after the caches, ``k_recent, v_recent, recent_slots``,
    and their new values as three more results."""
    sinks: bool = False
    """A last operand ``[H]``: one attention-sink logit per query head (as
    ``kv_cache_sdpa_update``'s ``sinks``)."""

    RING_SIZE: ClassVar[str] = "recent"

    def cache_kind(self) -> AffineCache:
        """The cache these attributes give."""
        return AffineCache(self.bits, self.group_size, self.hadamard)


_NEW = ["q", "new_k", "new_v"]


def _operand_names(count: int, attrs: QuantizedKVCacheSdpaAttrs) -> list[str]:
    """The operand names of an instruction with ``count`` operands (the key
    mask is there when one more operand is than the rest take)."""
    names = _NEW + attrs.cache_names() + ["offset"]
    sinks = ["sinks"] if attrs.sinks else []
    return names + (["key_mask"] if count > len(names) + len(sinks) else []) + sinks


def _check_quantized_sdpa(avals: list[AVal], attrs: QuantizedKVCacheSdpaAttrs) -> None:
    """q and the new keys/values as in ``kv_cache_sdpa_update`` (``BHTD``);
    caches of the packed width and group count of ``bits`` and
    ``group_size``, of the new keys' batch, heads and head dim; an integer
    offset and the optional key mask."""
    names = _operand_names(len(avals), attrs)
    _check_operand_count(avals, names, "quantized_kv_cache_sdpa_update"
                         + (" with recent" if attrs.recent else "")
                         + (" with sinks" if attrs.sinks else ""))
    ops = dict(zip(names, avals))
    q, new_k, new_v = ops["q"], ops["new_k"], ops["new_v"]
    _check_attention(q, new_k, new_v, "BHTD", ("q", "new_k", "new_v"))
    kind = attrs.cache_kind()
    geometry = kind.fit([ops[n] for n in kind.operand_names()])
    batch, kv_heads, slots, dim = geometry
    if (batch, kv_heads, dim) != (new_k.shape[0], new_k.shape[1], new_k.shape[3]):
        raise ValueError(f"new keys/values {new_k} do not fit a cache of {batch} rows, "
                         f"{kv_heads} heads of dim {dim}")
    if attrs.recent:
        attrs.ring().check(ops, geometry)
    if new_k.shape[2] > slots:
        raise ValueError(f"{new_k.shape[2]} new tokens do not fit a cache of {slots}")
    _check_offset(ops["offset"], "offset")
    if "key_mask" in ops:
        _check_key_mask(ops["key_mask"], batch, slots)
    if "sinks" in ops:
        _check_sinks(ops["sinks"], q.shape[1])


def _native_quantized_sdpa(avals: list[AVal], attrs: QuantizedKVCacheSdpaAttrs) -> bool:
    """Whether the native quantized-cache attention kernel computes this
    instruction (with or without ``hadamard``)."""
    named = dict(zip(_operand_names(len(avals), attrs), avals))
    kind = attrs.cache_kind()
    ring = [named[n] for n in RecentRing.NAMES] if attrs.recent else None
    return native.covers_cache_attention(named["q"], [named[n] for n in kind.operand_names()],
                                         kind, recent=ring, sinks=named.get("sinks"))


@register_op("quantized_kv_cache_sdpa_update", attrs=QuantizedKVCacheSdpaAttrs,
             operands=(10, 15), outputs=lambda attrs, n: 1 + len(attrs.cache_names()),
             check=_check_quantized_sdpa,
             native_coverage=_native_quantized_sdpa, context=True)
def quantized_kv_cache_sdpa_update(operands, attrs, context):
    """``kv_cache_sdpa_update`` (``BHTD`` layout) over a quantized cache:
    quantize the new keys and values (MLX's affine quantization, ``bits`` 4
    or 8, one float32 scale and bias per ``group_size`` features), write them
    into the caches at ``offset`` (clamped to ``[0, S - T]``) and attend with
    the scores and the weighted sum computed from the packed codes (the
    cache is never dequantized whole). Results: the attention output ``[B,
    H, T, D]`` (q's dtype), then the new ``k_values, k_scales, k_biases,
    v_values, v_scales, v_biases``.

    Operands: q ``[B, H, T, D]``, new_k and new_v ``[B, H_kv, T, D]``, the six
    caches (``*_values`` ``[B, H_kv, S, D * bits / 32]`` uint32, ``*_scales``
    and ``*_biases`` ``[B, H_kv, S, D / group_size]`` float32), offset (an
    integer scalar), an optional key_mask ``[B, S]`` and, with ``sinks=true``,
    sinks ``[H]`` (one attention-sink logit per query head: one more softmax
    column of no value, uncapped, as in ``fast_sdpa``). Query i sees key j
    when ``j <= offset + i`` and ``key_mask[b, j]``, with a ``window`` also
    ``j > offset + i - window``; rows that see no key give zeros. ``softcap``
    caps the scores as in ``kv_cache_sdpa_update``; ``scale`` defaults to
    ``1 / sqrt(D)``. Keys and values carry the quantization's rounding (at
    most half a step, ``scale / 2``, per feature). With ``hadamard`` the
    cache holds the quantization of ``hadamard_groups(k)`` (and of v's) as
    the module docstring says: the op transforms the new keys and values so
    before quantizing them, and q and the result to match. On the CPU with
    native kernels (float32 q) a kernel dequantizes blocks of keys and
    values once for all the query heads of a group as it attends.

    With ``recent`` (R) the cache has a recent ring (the module docstring):
    operands ``k_recent, v_recent, recent_slots`` after the six caches.
    Query t (slot ``p = start + t``, ``start`` the clamped offset) reads a
    key j it sees with ``p - j < R`` unrounded: this step's new key and value
    when ``j >= start``, else the ring's entry ``j % R`` when
    ``recent_slots[b, j % R] == j``; other keys quantized. The step then
    writes its last ``min(T, R)`` keys and values (in the cache's basis)
    and their slots into the ring, those the key mask keeps (a row's last
    kept token and the ``R - 1`` slots before it), the three new ring arrays
    being the last three results."""
    named = dict(zip(_operand_names(len(operands), attrs), operands))
    q, new_k, new_v, key_mask = named["q"], named["new_k"], named["new_v"], named.get("key_mask")
    sinks = named["sinks"].astype(mx.float32) if attrs.sinks else None
    kind = attrs.cache_kind()
    caches = [named[n] for n in kind.operand_names()]
    slots, tokens = caches[0].shape[2], new_k.shape[2]
    start = clamp_integer(named["offset"].reshape(1), 0, slots - tokens, mx.int32)
    new_k, new_v = (kind.basis(x) for x in (new_k, new_v))
    written = write_quantized(kind, caches, new_k, new_v, start)
    ring = RecentRows(*(named[n] for n in RecentRing.NAMES), new_k, new_v) if attrs.recent \
        else None
    window = None if attrs.window is None else min(attrs.window, slots)
    scale = attrs.scale if attrs.scale is not None else q.shape[3] ** -0.5
    out = native.cache_attention(context.native, q, written, start, key_mask, scale, window,
                                 attrs.softcap, kind, recent=None if ring is None else list(ring),
                                 sinks=sinks)
    if out is None:
        keep = _causal_keep(tokens, slots, start, key_mask, window)
        out = _attend(q, written, keep, scale, kind, attrs.softcap,
                      has_key_mask=key_mask is not None, ring=ring, start=start, sinks=sinks)
    if ring is None:
        return (out, *written)
    return (out, *written, *ring.updated(start, key_mask))


class RecentRows(NamedTuple):
    """What a step reads in float: the recent ring (``k_recent``,
    ``v_recent``, ``recent_slots``, see the module docstring) and the step's
    new keys and values ``[B, H_kv, T, D]`` in the cache's basis."""

    k_recent: mx.array
    v_recent: mx.array
    recent_slots: mx.array
    new_k: mx.array
    new_v: mx.array

    def updated(self, start: mx.array, key_mask: mx.array | None
                ) -> tuple[mx.array, mx.array, mx.array]:
        """The ring after a step writing at slot ``start`` (shape ``[1]``):
        of the R slots up to row b's last new token its ``key_mask`` keeps,
        each new one (``s >= start``) the mask keeps goes into entry ``s %
        R``; the other entries stay (without a mask: the step's last ``min(T,
        R)`` tokens; a right-padded prompt's padding is never written)."""
        size, tokens = self.recent_slots.shape[1], self.new_k.shape[2]
        steps = mx.arange(tokens, dtype=mx.int32)
        kept = (mx.ones((1, tokens), dtype=mx.bool_) if key_mask is None
                else mx.take(key_mask.astype(mx.bool_), start + steps, axis=1))
        last = start + mx.max(mx.where(kept, steps, -1), axis=1, keepdims=True)  # [B, 1]
        entry = mx.arange(size, dtype=mx.int32)
        slot = last - mx.remainder(last - entry, size)  # the newest slot <= last at entry i
        token = mx.clip(slot - start, 0, tokens - 1)
        fresh = (slot >= start) & mx.take_along_axis(
            mx.broadcast_to(kept, (slot.shape[0], tokens)), token, axis=1)
        rows = fresh[:, None, :, None]
        index = token[:, None, :, None]
        return (mx.where(rows, mx.take_along_axis(self.new_k, index, axis=2), self.k_recent),
                mx.where(rows, mx.take_along_axis(self.new_v, index, axis=2), self.v_recent),
                mx.where(fresh, slot, self.recent_slots))

    def coverage(self, keep: mx.array, start: mx.array) -> tuple[mx.array, ...]:
        """Which keys each query reads unrounded, under ``keep`` (``[B, T,
        S]``): ``(covered [B, T, S], ring_keep [B, T, R], new_keep [B, T,
        T])``, the slots read in float, then the ring's entries and
        the new tokens each query reads."""
        tags, (batch, tokens, slots) = self.recent_slots, keep.shape
        size = tags.shape[1]
        keys = mx.arange(slots, dtype=mx.int32)
        queries = mx.arange(tokens, dtype=mx.int32)[:, None] + start
        in_ring = (mx.take(tags, keys % size, axis=1) == keys) & (keys < start)
        covered = keep & (queries - keys < size) & ((keys >= start) | in_ring[:, None, :])
        entry = mx.arange(size, dtype=mx.int32)
        valid = (tags >= 0) & (tags < start) & (mx.remainder(tags, size) == entry)
        at_tags = mx.broadcast_to(mx.clip(tags, 0, slots - 1)[:, None, :], (batch, tokens, size))
        ring_keep = mx.take_along_axis(covered, at_tags, axis=2) & valid[:, None, :]
        new_keep = mx.take(covered, start + mx.arange(tokens, dtype=mx.int32), axis=2)
        return covered, ring_keep, new_keep


def write_quantized(kind: AffineCache, caches: list[mx.array], new_k: mx.array,
                    new_v: mx.array, start: mx.array) -> list[mx.array]:
    """The cache's arrays with ``new_k`` and ``new_v`` (``[B, H_kv, T, D]``,
    float32 in the cache's basis: :meth:`AffineCache.basis
    <mlxprog.cache_kinds.AffineCache.basis>`) quantized and written at slot
    ``start``."""
    per_side = len(kind.parts)
    written = []
    for side, new, parts in (("k", new_k, caches[:per_side]), ("v", new_v, caches[per_side:])):
        for cache, part in zip(parts, kind.pack(new, side)):
            written.append(mx.slice_update(cache, part, start, axes=(2,)))
    return written


def _attend(q: mx.array, caches: list[mx.array], keep: mx.array, scale: float,
            kind: AffineCache, softcap: float | None, has_key_mask: bool,
            ring: RecentRows | None = None, start: mx.array | None = None,
            sinks: mx.array | None = None) -> mx.array:
    """Softmax attention of q over the quantized caches under ``keep``
    (``[T, S]`` or ``[B, 1, T, S]``) with MLX's ``quantized_matmul``,
    grouped-query heads as ``[B, H_kv, H / H_kv, T, D]`` so the caches need
    no copies; with ``hadamard`` in the transformed basis (q transformed and
    divided by the group size, a power of two; the result transformed
    back). With a recent ring (``ring``, the step writing at ``start``) the
    keys it covers are scored from it instead, one softmax over the
    quantized keys, the ring's and the new ones together. ``sinks`` ``[H]``
    (float32): one more column of that softmax per head, of no value."""
    b, heads, t, d = q.shape
    kv_heads = caches[0].shape[1]
    group = heads // kv_heads
    per_side = len(kind.parts)
    dtype, q = q.dtype, q.astype(mx.float32)
    if kind.hadamard:
        q = hadamard_groups(q, kind.group_size) * (1 / kind.group_size)
    qg = (q * scale).reshape(b, kv_heads, group, t, d)
    k_parts = [mx.expand_dims(c, 2) for c in caches[:per_side]]
    v_parts = [mx.expand_dims(c, 2) for c in caches[per_side:]]
    keys = [mx.quantized_matmul(qg, *k_parts, transpose=True, **kind.quantization("k"))]
    if ring is None:
        masks = [keep if keep.ndim == 2 else mx.expand_dims(keep, 2)]
    else:
        seen = mx.broadcast_to(keep if keep.ndim == 2 else keep[:, 0], (b, *keep.shape[-2:]))
        covered, ring_keep, new_keep = ring.coverage(seen, start)
        float_rows = (mx.expand_dims(ring.k_recent, 2), mx.expand_dims(ring.new_k, 2))
        keys += [qg @ k.swapaxes(-1, -2) for k in float_rows]
        masks = [m[:, None, None] for m in (seen & ~covered, ring_keep, new_keep)]
    if softcap is not None:
        keys = [mx.tanh(k / softcap) * softcap for k in keys]
    masked = [mx.where(m, k, mx.finfo(k.dtype).min) for k, m in zip(keys, masks)]
    if sinks is not None:
        masked.append(mx.broadcast_to(sinks.reshape(kv_heads, group, 1, 1),
                                      (*masked[0].shape[:-1], 1)))
    scores = masked[0] if len(masked) == 1 else mx.concatenate(masked, axis=-1)
    probs = mx.softmax(scores, axis=-1, precise=True)
    if sinks is not None:
        probs = probs[..., :-1]
    ends = list(itertools.accumulate(k.shape[-1] for k in keys))[:-1]
    probs = mx.split(probs, ends, axis=-1) if ends else [probs]
    out = mx.quantized_matmul(probs[0], *v_parts, transpose=False, **kind.quantization("v"))
    if ring is not None:
        for p, v in zip(probs[1:], (ring.v_recent, ring.new_v)):
            out = out + p @ mx.expand_dims(v, 2)
    out = out.reshape(b, heads, t, d)
    if kind.hadamard:
        out = hadamard_groups(out, kind.group_size) * (1 / kind.group_size)
    out = out.astype(dtype)
    if not has_key_mask:
        return out
    return mx.where(mx.any(keep, axis=-1, keepdims=True), out, mx.zeros((), out.dtype))
