"""Attention: scaled dot-product attention (masks, grouped-query heads,
attention sinks) and a fused KV-cache update with attention over the cache
(over a quantized cache: :mod:`.quantized_attention`; a whole llama-style
attention block: :mod:`.attention_block`).

Everything that changes from one decode step to the next (cache offsets,
positions) is an operand, so a decode-step program is traced once and
replayed. Attention tensors are ``[B, H, T, D]`` (batch, heads, tokens, head
dim) unless an op says otherwise.
"""

from __future__ import annotations

from typing import Annotated, Literal

import mlx.core as mx
from pydantic import Field

from ..arrays import AVal, is_floating
from ..cache_kinds import FloatCache
from ..native import kernels as native
from .attrs import Attrs, PositiveSize
from .index import clamp_integer
from .positions import _check_offset
from .registry import register_op

Layout = Literal["BHTD", "BTHD"]

_HEAD_AXIS = {"BHTD": 1, "BTHD": 2}
_TIME_AXIS = {"BHTD": 2, "BTHD": 1}


def _check_attention(q: AVal, k: AVal, v: AVal, layout: Layout = "BHTD",
                     names: tuple[str, str, str] = ("q", "k", "v")) -> None:
    """Ranks, batch sizes, head counts (grouped-query) and head dims of q, k, v."""
    for name, aval in zip(names, (q, k, v)):
        if len(aval.shape) != 4:
            raise ValueError(f"{name} must be rank 4 [{', '.join(layout)}], found {aval}")
    h, t = _HEAD_AXIS[layout], _TIME_AXIS[layout]
    qn, kn, vn = names
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        raise ValueError(
            f"{qn}, {kn}, {vn} must have one batch size, found {q.shape[0]}, {k.shape[0]}, "
            f"{v.shape[0]}"
        )
    if k.shape[h] != v.shape[h] or k.shape[t] != v.shape[t]:
        raise ValueError(
            f"{kn} and {vn} must have the same heads and tokens, found {k} and {v}"
        )
    if q.shape[h] % k.shape[h]:
        raise ValueError(
            f"{qn} has {q.shape[h]} heads, which is not a multiple of the {k.shape[h]} "
            f"key/value heads"
        )
    if q.shape[3] != k.shape[3]:
        raise ValueError(
            f"{qn} and {kn} must have the same head dim, found {q.shape[3]} and {k.shape[3]}"
        )


def _check_key_mask(key_mask: AVal, batch: int, keys: int) -> None:
    """A key mask is ``[B, T_kv]``."""
    if key_mask.shape != (batch, keys):
        raise ValueError(f"key_mask must be [{batch}, {keys}] (batch, keys), found {key_mask}")


def _check_sinks(sinks: AVal, heads: int) -> None:
    """Sinks hold one logit per query head."""
    if sinks.shape != (heads,):
        raise ValueError(f"sinks must be [{heads}] (one per query head), found {sinks}")


def _check_operand_count(avals: list[AVal], names: list[str], setting: str) -> None:
    """The instruction gives exactly the operands ``names`` its ``setting`` calls for."""
    if len(avals) != len(names):
        raise ValueError(
            f"{setting} takes operands ({', '.join(names)}); found {len(avals)} operand(s)"
        )


def _scale(scale: float | None, q: mx.array) -> float:
    """The attention scale: ``scale``, else ``1 / sqrt(D)``."""
    return scale if scale is not None else q.shape[-1] ** -0.5


def _causal_keep(t_q: int, t_kv: int, start: mx.array, key_mask: mx.array | None,
                 window: int | None = None) -> mx.array:
    """Which keys each query sees: key j is visible to query i when
    ``j <= start + i``, with a ``window`` also ``j > start + i - window``, and
    ``key_mask[b, j]``. ``[T_q, T_kv]``, or ``[B, 1, T_q, T_kv]`` with a key
    mask."""
    keys, last = mx.arange(t_kv), mx.arange(t_q)[:, None] + start.reshape(())
    keep = keys <= last
    if window is not None:
        keep = keep & (keys > last - window)
    if key_mask is None:
        return keep
    return keep & key_mask.astype(mx.bool_)[:, None, None, :]


def _attend_keep(q, k, v, scale, keep, sinks, has_key_mask: bool) -> mx.array:
    """SDPA under a boolean ``keep`` mask; rows where no key is visible (possible
    only with a key mask) are zero rather than NaN or a uniform average."""
    out = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=keep, sinks=sinks)
    if not has_key_mask:
        return out
    return mx.where(mx.any(keep, axis=-1, keepdims=True), out, mx.zeros((), out.dtype))


def _attend_softcapped(q, k, v, scale, softcap, keep, sinks, has_key_mask: bool) -> mx.array:
    """Attention with capped scores ``softcap * tanh(q @ k.T * scale / softcap)``,
    under a boolean ``keep`` mask, with a precise softmax (as mlx-lm's Gemma 2)
    and ``sinks`` (uncapped) as in ``_attend_keep``; rows where no key is visible
    (possible only with a key mask) are zero. The scores are computed
    explicitly: ``mx.fast.scaled_dot_product_attention`` cannot cap them."""
    b, heads, t, d = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    # Grouped-query heads as [B, H_kv, H / H_kv, T, D], so k and v need no copies.
    q = (q * scale).reshape(b, kv_heads, group, t, d)
    k, v = mx.expand_dims(k, 2), mx.expand_dims(v, 2)
    scores = mx.tanh((q @ k.swapaxes(-1, -2)) / softcap) * softcap
    grouped_keep = keep if keep.ndim == 2 else mx.expand_dims(keep, 2)
    scores = mx.where(grouped_keep, scores, mx.finfo(scores.dtype).min)
    if sinks is not None:
        column = mx.broadcast_to(sinks.reshape(kv_heads, group, 1, 1), (*scores.shape[:-1], 1))
        scores = mx.concatenate([scores, column], axis=-1)
    probs = mx.softmax(scores, axis=-1, precise=True)
    if sinks is not None:
        probs = probs[..., :-1]
    out = (probs @ v).reshape(b, heads, t, d)
    if not has_key_mask:
        return out
    return mx.where(mx.any(keep, axis=-1, keepdims=True), out, mx.zeros((), out.dtype))


def _sees_some_key(mask: mx.array) -> mx.array:
    """Whether each query row of an attention ``mask`` (boolean, or additive
    in q's dtype) leaves some key visible, broadcastable against the output.

    MLX gives a row that hides every key the average of all values (boolean),
    NaN (-inf) or either one depending on the dtype (the dtype's lowest value),
    so such rows are set to zeros instead."""
    mask = mx.atleast_1d(mask)
    visible = mask if mask.dtype == mx.bool_ else mask > mx.finfo(mask.dtype).min
    return mx.any(visible, axis=-1, keepdims=True)


_MASK_OPERANDS = {
    "none": [],
    "array": ["mask"],
    "causal": [],
    "causal_key_masked": ["key_mask", "kv_offset"],
}


class SdpaAttrs(Attrs):
    """The attributes of ``fast_sdpa``; ``mask`` and ``sinks`` decide its operands."""

    scale: float | None = None
    mask: Literal["none", "array", "causal", "causal_key_masked"] = "none"
    sinks: bool = False

    def operand_names(self) -> list[str]:
        """The operands this setting takes, in order."""
        return ["q", "k", "v", *_MASK_OPERANDS[self.mask], *(["sinks"] if self.sinks else [])]


def _check_sdpa(avals: list[AVal], attrs: SdpaAttrs) -> None:
    """The operands ``mask`` and ``sinks`` call for, and their shapes."""
    names = attrs.operand_names()
    setting = f"mask={attrs.mask!r}" + (" with sinks" if attrs.sinks else "")
    _check_operand_count(avals, names, setting)
    ops = dict(zip(names, avals))
    _check_attention(ops["q"], ops["k"], ops["v"])
    if "mask" in ops:
        mask = ops["mask"]
        if not (mask.dtype == mx.bool_ or is_floating(mask.dtype)) or len(mask.shape) > 4:
            raise ValueError(
                f"mask must be a boolean or additive float array of rank <= 4, found {mask}"
            )
    if "key_mask" in ops:
        _check_key_mask(ops["key_mask"], ops["k"].shape[0], ops["k"].shape[2])
        _check_offset(ops["kv_offset"], "kv_offset")
    if "sinks" in ops:
        _check_sinks(ops["sinks"], ops["q"].shape[1])


@register_op("fast_sdpa", attrs=SdpaAttrs, operands=(3, 6), check=_check_sdpa)
def fast_sdpa(operands, attrs):
    """Scaled dot-product attention ``softmax(q @ k.T * scale + mask) @ v``
    (``mx.fast.scaled_dot_product_attention``) over ``[B, H, T, D]`` tensors.
    k and v may have fewer heads than q (grouped-query attention; q's heads must
    be a multiple). ``scale`` defaults to ``1 / sqrt(D)``.

    Operands: q, k, v, then by ``mask``:

    - ``"none"``: nothing more.
    - ``"array"``: a mask broadcastable to ``[B, H, T_q, T_kv]``, boolean (true
      keeps) or additive (a float mask is cast to q's dtype). A key is hidden
      where the mask is false, or -inf or the dtype's lowest finite value
      (after the cast); query rows that see no key give zeros.
    - ``"causal"``: nothing more; the last query aligns with the last key (so
      with more queries than keys the first ``T_q - T_kv`` see none and give
      zeros).
    - ``"causal_key_masked"``: key_mask ``[B, T_kv]`` (true or nonzero for a valid
      key, e.g. false on left padding) and kv_offset, an integer scalar of any
      integer dtype and value: query i sees key j when ``j <= kv_offset + i``
      and the key is valid. Query rows that see no key give zeros.

    With ``sinks=true`` a last operand ``[H]`` holds one attention-sink logit per
    query head: an extra softmax column that takes probability mass but adds no
    value (cast to q's dtype)."""
    q, k, v, *rest = operands
    sinks = rest.pop().astype(q.dtype) if attrs.sinks else None
    scale = _scale(attrs.scale, q)
    if attrs.mask == "causal_key_masked":
        return _sdpa_key_masked(q, k, v, scale, *rest, sinks)
    if attrs.mask == "array":
        return _sdpa_array_mask(q, k, v, scale, rest[0], sinks)
    if attrs.mask == "causal":
        return _sdpa_causal(q, k, v, scale, sinks)
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, sinks=sinks)


def _sdpa_key_masked(q, k, v, scale, key_mask, kv_offset, sinks) -> mx.array:
    """``fast_sdpa`` with ``mask="causal_key_masked"``."""
    # Offsets at or below -T_q hide every key and those from T_kv up show them
    # all, so clamping changes nothing (and no offset overflows).
    start = clamp_integer(kv_offset, -q.shape[2], k.shape[2], mx.int32)
    keep = _causal_keep(q.shape[2], k.shape[2], start, key_mask)
    return _attend_keep(q, k, v, scale, keep, sinks, has_key_mask=True)


def _sdpa_array_mask(q, k, v, scale, mask, sinks) -> mx.array:
    """``fast_sdpa`` with ``mask="array"``."""
    mask = mask if mask.dtype == mx.bool_ else mask.astype(q.dtype)
    out = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask, sinks=sinks)
    return mx.where(_sees_some_key(mask), out, mx.zeros((), out.dtype))


def _sdpa_causal(q, k, v, scale, sinks) -> mx.array:
    """``fast_sdpa`` with ``mask="causal"``."""
    out = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal",
                                               sinks=sinks)
    t_q, t_kv = q.shape[2], k.shape[2]
    if t_q <= t_kv:
        return out
    # The first T_q - T_kv queries precede every key; MLX gives them the average
    # of all values.
    sees_a_key = mx.arange(t_q)[:, None] >= t_q - t_kv
    return mx.where(sees_a_key, out, mx.zeros((), out.dtype))


class KVCacheSdpaAttrs(Attrs):
    """The attributes of ``kv_cache_sdpa_update``."""

    scale: float | None = None
    layout: Layout = "BTHD"
    sinks: bool = False
    softcap: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    """Cap the attention scores at ``softcap * tanh(score / softcap)`` (Gemma 2's
    attention logit softcapping)."""
    window: PositiveSize | None = None
    """Sliding-window attention: a query sees only the last ``window`` keys up
    to and including its own."""


def _check_kv_cache_sdpa(avals: list[AVal], attrs: KVCacheSdpaAttrs) -> None:
    """q, new keys/values and caches that fit together in ``layout``; an
    integer offset, and the optional key mask and sinks."""
    names = ["q", "new_k", "new_v", "k_cache", "v_cache", "offset"]
    if len(avals) - int(attrs.sinks) > len(names):
        names.append("key_mask")
    names += ["sinks"] if attrs.sinks else []
    setting = "kv_cache_sdpa_update" + (" with sinks" if attrs.sinks else "")
    _check_operand_count(avals, names, setting)
    ops = dict(zip(names, avals))
    q, new_k, new_v = ops["q"], ops["new_k"], ops["new_v"]
    k_cache, v_cache = ops["k_cache"], ops["v_cache"]
    _check_attention(q, new_k, new_v, attrs.layout, ("q", "new_k", "new_v"))
    _check_attention(q, k_cache, v_cache, attrs.layout, ("q", "k_cache", "v_cache"))
    t, h = _TIME_AXIS[attrs.layout], _HEAD_AXIS[attrs.layout]
    for new, cache in ((new_k, k_cache), (new_v, v_cache)):
        if new.shape[h] != cache.shape[h] or new.shape[3] != cache.shape[3]:
            raise ValueError(
                f"new keys/values {new} do not fit a cache {cache} ({attrs.layout})"
            )
    if q.shape[t] != new_k.shape[t]:
        raise ValueError(
            f"q has {q.shape[t]} tokens but new_k has {new_k.shape[t]}; each query is "
            "one of the tokens written"
        )
    if new_k.shape[t] > k_cache.shape[t]:
        raise ValueError(
            f"{new_k.shape[t]} new tokens do not fit a cache of {k_cache.shape[t]}"
        )
    _check_offset(ops["offset"], "offset")
    if "key_mask" in ops:
        _check_key_mask(ops["key_mask"], k_cache.shape[0], k_cache.shape[t])
    if "sinks" in ops:
        _check_sinks(ops["sinks"], q.shape[h])


def _native_kv_cache_sdpa_update(avals, attrs) -> bool:
    """Whether the native cache-attention kernel computes this instruction."""
    q, _, _, k_cache, v_cache = avals[:5]
    return attrs.layout == "BHTD" and native.covers_cache_attention(
        q, [k_cache, v_cache], FloatCache(), sinks=avals[-1] if attrs.sinks else None)


@register_op("kv_cache_sdpa_update", attrs=KVCacheSdpaAttrs, operands=(6, 8), outputs=3,
             check=_check_kv_cache_sdpa, native_coverage=_native_kv_cache_sdpa_update,
             context=True)
def kv_cache_sdpa_update(operands, attrs, context):
    """Write new keys and values into fixed-size caches, then attend over the
    whole cache. Results: (attention output, new k_cache, new v_cache).

    Operands: q, new_k, new_v, k_cache, v_cache, offset, an optional key_mask
    and, with ``sinks=true``, sinks ``[H]`` (see ``fast_sdpa``). With
    ``layout="BTHD"`` (default) q is ``[B, T, H, D]`` and the caches
    ``[B, T_max, H_kv, D]``; with ``"BHTD"`` q is ``[B, H, T, D]`` and the caches
    ``[B, H_kv, T_max, D]``, which attends without transposing the cache. new_k
    and new_v hold the T tokens of q in the cache layout; the output has q's
    layout.

    offset (an integer scalar array of any integer dtype, so each step replays
    one trace) is where the T new tokens go, clamped to ``[0, T_max - T]``. Query i is written at
    cache position ``offset + i`` (clamped offset) and sees key j when
    ``j <= offset + i`` (so slots after it, not yet written in a sequential
    decode, are never seen) and ``key_mask[b, j]`` (``[B, T_max]``, false on
    left padding). With a ``window`` it sees key j only when also
    ``j > offset + i - window``: the last ``window`` cache slots up to its own
    (sliding-window attention, as Mistral's and Gemma's local layers). Query
    rows that see no key give zeros. ``scale`` defaults to ``1 / sqrt(D)``.

    With ``softcap`` the scores ``s = q . k * scale`` become
    ``softcap * tanh(s / softcap)`` before masking and the softmax (Gemma 2's
    attention logit softcapping; a precise softmax, as mlx-lm's); sinks are
    not capped."""
    q, new_k, new_v, k_cache, v_cache, offset, *rest = operands
    sinks = rest.pop().astype(q.dtype) if attrs.sinks else None
    key_mask = rest[0] if rest else None
    t_axis = _TIME_AXIS[attrs.layout]
    t_max, t_new = k_cache.shape[t_axis], new_k.shape[t_axis]
    start = clamp_integer(offset.reshape(1), 0, t_max - t_new, mx.int32)
    k_cache = mx.slice_update(k_cache, new_k, start, axes=(t_axis,))
    v_cache = mx.slice_update(v_cache, new_v, start, axes=(t_axis,))
    scale = _scale(attrs.scale, q)
    # A window past the cache's size changes nothing (and then fits in int32).
    window = None if attrs.window is None else min(attrs.window, t_max)
    if attrs.layout == "BHTD":
        out = native.cache_attention(context.native, q, [k_cache, v_cache], start, key_mask,
                                     scale, window, attrs.softcap, FloatCache(), sinks=sinks)
        if out is not None:
            return out, k_cache, v_cache
    keep = _causal_keep(t_new, t_max, start, key_mask, window)
    if attrs.layout == "BTHD":
        qh, kh, vh = (a.swapaxes(1, 2) for a in (q, k_cache, v_cache))
    else:
        qh, kh, vh = q, k_cache, v_cache
    if attrs.softcap is None:
        out = _attend_keep(qh, kh, vh, scale, keep, sinks, key_mask is not None)
    else:
        out = _attend_softcapped(qh, kh, vh, scale, attrs.softcap, keep, sinks,
                                 key_mask is not None)
    if attrs.layout == "BTHD":
        out = out.swapaxes(1, 2)
    return out, k_cache, v_cache
