"""LLM kernels: fused norms and activations, scaled dot-product attention
(masks, grouped-query heads, attention sinks), rotary position embeddings, a
fused KV-cache update, and token sampling.

Everything that changes from one decode step to the next (cache offsets,
positions, PRNG keys) is an operand, so a decode-step program is traced once
and replayed. Attention tensors are ``[B, H, T, D]`` (batch, heads, tokens,
head dim) unless an op says otherwise.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import mlx.core as mx
from pydantic import Field, model_validator

from ..arrays import AVal, is_floating, is_integer, name_of
from ..native import kernels as native
from .attrs import Attrs, PositiveInt
from .index import clamp_integer
from .registry import register_op

NonNegativeFloat = Annotated[float, Field(ge=0)]

_INT32 = mx.iinfo(mx.int32)  # the RoPE kernels take int32 positions


# -- norms and activations ------------------------------------------------------


class NormAttrs(Attrs):
    """The attributes of ``fast_rms_norm`` and ``fast_layer_norm``."""

    eps: NonNegativeFloat = 1e-5


@register_op("fast_rms_norm", attrs=NormAttrs, operands=2,
             native_coverage=lambda avals, attrs: native.covers_rms_norm(*avals))
def fast_rms_norm(operands, attrs):
    """RMS norm over the last axis, ``x / sqrt(mean(x**2) + eps) * weight``
    (``mx.fast.rms_norm``). Operands: x ``[..., D]``, weight ``[D]``."""
    x, weight = operands
    out = native.rms_norm(x, weight, attrs.eps)
    return out if out is not None else mx.fast.rms_norm(x, weight, attrs.eps)


def _check_add_rms_norm(avals: list[AVal], attrs: NormAttrs) -> None:
    """x and y of one shape and dtype, and a weight ``[D]``."""
    x, y, weight = avals
    if x != y:
        raise ValueError(f"x and y must have one shape and dtype, found {x} and {y}")
    if len(x.shape) < 1 or weight.shape != (x.shape[-1],):
        raise ValueError(f"weight must be [{x.shape[-1] if x.shape else 'D'}] (x's last axis), "
                         f"found {weight}")


@register_op("fast_add_rms_norm", attrs=NormAttrs, operands=3, outputs=2,
             check=_check_add_rms_norm,
             native_coverage=lambda avals, attrs: native.covers_add_rms_norm(*avals))
def fast_add_rms_norm(operands, attrs):
    """A residual add and the RMS norm of its result, as in every layer of a
    transformer: results ``s = x + y`` and ``fast_rms_norm(s, weight)``.
    Operands: x, y ``[..., D]`` (one shape and dtype), weight ``[D]``. On the
    CPU with native kernels (float32) one graph node instead of two."""
    x, y, weight = operands
    out = native.add_rms_norm(x, y, weight, attrs.eps)
    if out is not None:
        return tuple(out)
    total = x + y
    return total, fast_rms_norm([total, weight], attrs)


@register_op("fast_layer_norm", attrs=NormAttrs, operands=(2, 3))
def fast_layer_norm(operands, attrs):
    """Layer norm over the last axis, ``(x - mean) / sqrt(var + eps) * weight + bias``
    (``mx.fast.layer_norm``). Operands: x ``[..., D]``, weight ``[D]``, and an
    optional bias ``[D]``."""
    x, weight, *bias = operands
    return mx.fast.layer_norm(x, weight, bias[0] if bias else None, attrs.eps)


def _check_swiglu(avals: list[AVal], attrs) -> None:
    """One operand: its last axis holds the gate, then up (even length)."""
    if len(avals) == 1 and (not avals[0].shape or avals[0].shape[-1] % 2):
        raise ValueError(f"one operand holds gate and up as the halves of its last axis, "
                         f"which must have an even length; found {avals[0]}")


def _native_swiglu(avals, attrs) -> bool:
    """Whether the native kernel computes this instruction (the one-operand form)."""
    return len(avals) == 1 and native.covers_swiglu_halves(avals[0])


@register_op("fast_swiglu", operands=(1, 2), check=_check_swiglu,
             native_coverage=_native_swiglu)
def fast_swiglu(operands, attrs):
    """The SwiGLU gate ``silu(gate) * up``. Operands: gate and up
    (broadcasting), or one operand ``[..., 2I]`` holding gate then up along
    its last axis (a fused gate/up projection's output), which gives
    ``[..., I]``: on the CPU with native kernels (float32) one graph node."""
    if len(operands) == 1:
        out = native.swiglu_halves(operands[0])
        if out is not None:
            return out
        gate, up = mx.split(operands[0], 2, axis=-1)
    else:
        gate, up = operands
    return gate * mx.sigmoid(gate) * up


@register_op("gelu_approx")
def gelu_approx(operands, attrs):
    """GELU, tanh approximation:
    ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``."""
    x = operands[0]
    inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1 + mx.tanh(inner))


# -- attention ------------------------------------------------------------------

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


def _check_offset(offset: AVal, what: str, sizes: tuple[tuple[int, ...], ...] = ((), (1,))) -> None:
    """An offset operand is an integer array of one of the shapes ``sizes``."""
    if not is_integer(offset.dtype) or offset.shape not in sizes:
        shapes = " or ".join(str(list(s)) for s in sizes)
        raise ValueError(f"{what} must be an integer array of shape {shapes}, found {offset}")


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


def _causal_keep(t_q: int, t_kv: int, start: mx.array, key_mask: mx.array | None) -> mx.array:
    """Which keys each query sees: key j is visible to query i when
    ``j <= start + i`` and ``key_mask[b, j]``. ``[T_q, T_kv]``, or
    ``[B, 1, T_q, T_kv]`` with a key mask."""
    keep = mx.arange(t_kv) <= mx.arange(t_q)[:, None] + start.reshape(())
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
    return (attrs.layout == "BHTD" and not attrs.sinks
            and native.covers_cache_attention(q, k_cache, v_cache))


@register_op("kv_cache_sdpa_update", attrs=KVCacheSdpaAttrs, operands=(6, 8), outputs=3,
             check=_check_kv_cache_sdpa, native_coverage=_native_kv_cache_sdpa_update)
def kv_cache_sdpa_update(operands, attrs):
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
    left padding). Query rows that see no key give zeros. ``scale`` defaults
    to ``1 / sqrt(D)``."""
    q, new_k, new_v, k_cache, v_cache, offset, *rest = operands
    sinks = rest.pop().astype(q.dtype) if attrs.sinks else None
    key_mask = rest[0] if rest else None
    t_axis = _TIME_AXIS[attrs.layout]
    t_max, t_new = k_cache.shape[t_axis], new_k.shape[t_axis]
    start = clamp_integer(offset.reshape(1), 0, t_max - t_new, mx.int32)
    k_cache = mx.slice_update(k_cache, new_k, start, axes=(t_axis,))
    v_cache = mx.slice_update(v_cache, new_v, start, axes=(t_axis,))
    if attrs.layout == "BHTD" and sinks is None:
        out = native.cache_attention(q, k_cache, v_cache, start, key_mask,
                                     _scale(attrs.scale, q))
        if out is not None:
            return out, k_cache, v_cache
    keep = _causal_keep(t_new, t_max, start, key_mask)
    if attrs.layout == "BTHD":
        qh, kh, vh = (a.swapaxes(1, 2) for a in (q, k_cache, v_cache))
    else:
        qh, kh, vh = q, k_cache, v_cache
    out = _attend_keep(qh, kh, vh, _scale(attrs.scale, q), keep, sinks, key_mask is not None)
    if attrs.layout == "BTHD":
        out = out.swapaxes(1, 2)
    return out, k_cache, v_cache


class KVCacheAttentionBlockAttrs(Attrs):
    """The attributes of ``kv_cache_attention_block``."""

    heads: PositiveInt
    kv_heads: PositiveInt
    rope_dims: PositiveInt | None = None  # None: the head dim
    traditional: bool = False
    base: Annotated[float, Field(gt=0)] = 10000.0
    rope_scale: float = 1.0
    freqs: bool = False  # a freqs [rope_dims / 2] operand instead of base
    scale: float | None = None

    @model_validator(mode="after")
    def _heads_in_groups(self):
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        if self.rope_dims is not None and self.rope_dims % 2:
            raise ValueError(f"rope_dims must be even, found {self.rope_dims}")
        return self


def _block_operand_names(avals: list[AVal], attrs: KVCacheAttentionBlockAttrs) -> list[str]:
    """The operand names of a ``kv_cache_attention_block`` with these attributes
    (the key mask is there when one more operand is)."""
    names = ["qkv", "k_cache", "v_cache", "offset", "positions"]
    names += ["freqs"] if attrs.freqs else []
    return names + (["key_mask"] if len(avals) > len(names) else [])


def _check_kv_cache_attention_block(avals: list[AVal], attrs: KVCacheAttentionBlockAttrs) -> None:
    """qkv ``[B, T, (heads + 2 kv_heads) D]`` and caches ``[B, kv_heads, S,
    D]`` of one float dtype, T <= S; integer offset and positions, the freqs
    and key mask where present."""
    names = _block_operand_names(avals, attrs)
    _check_operand_count(avals, names, "kv_cache_attention_block"
                         + (" with freqs" if attrs.freqs else ""))
    ops = dict(zip(names, avals))
    qkv, k_cache, v_cache = ops["qkv"], ops["k_cache"], ops["v_cache"]
    if len(k_cache.shape) != 4 or k_cache != v_cache:
        raise ValueError(f"k_cache and v_cache must be alike, [B, kv_heads, S, D]; found "
                         f"{k_cache} and {v_cache}")
    B, kv_heads, S, D = k_cache.shape
    if kv_heads != attrs.kv_heads:
        raise ValueError(f"the caches hold {kv_heads} heads, attribute kv_heads is "
                         f"{attrs.kv_heads}")
    width = (attrs.heads + 2 * attrs.kv_heads) * D
    if len(qkv.shape) != 3 or qkv.shape[0] != B or qkv.shape[2] != width:
        raise ValueError(f"qkv must be [{B}, T, {width}] ((heads + 2 kv_heads) x {D}, the "
                         f"caches' head dim), found {qkv}")
    if qkv.dtype != k_cache.dtype or not is_floating(qkv.dtype):
        raise ValueError(f"qkv and the caches must have one float dtype; found {qkv} and "
                         f"{k_cache}")
    if qkv.shape[1] > S:
        raise ValueError(f"{qkv.shape[1]} new tokens do not fit a cache of {S}")
    dims = attrs.rope_dims or D
    if dims > D:
        raise ValueError(f"rope_dims {dims} exceeds the head dim {D}")
    _check_offset(ops["offset"], "offset")
    _check_offset(ops["positions"], "positions", ((), (1,), (B,)))
    if "freqs" in ops and ops["freqs"].shape != (dims // 2,):
        raise ValueError(f"freqs must be [{dims // 2}] (rope_dims / 2), found {ops['freqs']}")
    if "key_mask" in ops:
        _check_key_mask(ops["key_mask"], B, S)


def _native_kv_cache_attention_block(avals, attrs) -> bool:
    """Whether the native attention-block kernel computes this instruction."""
    qkv, k_cache, v_cache = avals[:3]
    return native.covers_cache_attention_block(qkv, k_cache, v_cache)


@register_op("kv_cache_attention_block", attrs=KVCacheAttentionBlockAttrs, operands=(5, 7),
             outputs=3, check=_check_kv_cache_attention_block,
             native_coverage=_native_kv_cache_attention_block)
def kv_cache_attention_block(operands, attrs):
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
    (token-major, ready for the output projection), the new k_cache and
    v_cache.

    Operands: qkv, k_cache, v_cache, offset (an integer scalar), positions
    (an integer scalar or ``[B]``), freqs ``[rope_dims / 2]`` when
    ``freqs=true``, and an optional key_mask ``[B, S]``. On the CPU with
    native kernels (float32) it is one graph node instead of about eight."""
    named = dict(zip(_block_operand_names(operands, attrs), operands))
    qkv, k_cache, v_cache = named["qkv"], named["k_cache"], named["v_cache"]
    B, T, _ = qkv.shape
    S, D = k_cache.shape[2], k_cache.shape[3]
    dims = attrs.rope_dims or D
    start = clamp_integer(named["offset"].reshape(1), 0, S - T, mx.int32)
    positions = _int32_positions(named["positions"].reshape(-1))
    freqs, key_mask = named.get("freqs"), named.get("key_mask")
    scale = attrs.scale if attrs.scale is not None else D ** -0.5
    out = native.cache_attention_block(
        qkv, k_cache, v_cache, start, positions, heads=attrs.heads, kv_heads=attrs.kv_heads,
        dims=dims, traditional=attrs.traditional, base=attrs.base, rope_scale=attrs.rope_scale,
        scale=scale, freqs=freqs, key_mask=key_mask)
    if out is not None:
        return tuple(out)
    heads = qkv.reshape(B, T, attrs.heads + 2 * attrs.kv_heads, D).transpose(0, 2, 1, 3)
    q, k, v = mx.split(heads, [attrs.heads, attrs.heads + attrs.kv_heads], axis=1)
    rope = dict(traditional=attrs.traditional, scale=attrs.rope_scale, offset=positions)
    if freqs is None:
        q, k = (mx.fast.rope(a, dims, base=attrs.base, **rope) for a in (q, k))
    else:
        q, k = (mx.fast.rope(a, dims, base=None, freqs=freqs, **rope) for a in (q, k))
    sdpa = [q, k, v, k_cache, v_cache, start] + ([key_mask] if key_mask is not None else [])
    out, k_cache, v_cache = kv_cache_sdpa_update(
        sdpa, KVCacheSdpaAttrs(scale=scale, layout="BHTD"))
    return out.transpose(0, 2, 1, 3).reshape(B, T, attrs.heads * D), k_cache, v_cache


# -- rotary position embeddings -------------------------------------------------


class RopeFreqsPositionsAttrs(Attrs):
    """The attributes of ``fast_rope_with_freqs_positions``, which every RoPE op takes."""

    dims: PositiveInt
    traditional: bool = False
    scale: float = 1.0

    @model_validator(mode="after")
    def _even_dims(self):
        # Features rotate in pairs.
        if self.dims % 2:
            raise ValueError(f"dims must be even, found {self.dims}")
        return self


class RopeFreqsAttrs(RopeFreqsPositionsAttrs):
    """The attributes of ``fast_rope_with_freqs``: a constant start position too."""

    offset: Annotated[int, Field(ge=_INT32.min, le=_INT32.max)] = 0


class RopeAttrs(RopeFreqsAttrs):
    """The attributes of ``fast_rope``: the frequencies' base too."""

    base: Annotated[float, Field(gt=0)] = 10000.0


class RopePositionsAttrs(RopeFreqsPositionsAttrs):
    """The attributes of ``fast_rope_positions``: the frequencies' base too."""

    base: Annotated[float, Field(gt=0)] = 10000.0


def _check_rope_x(x: AVal, freqs: AVal | None, attrs: RopeFreqsPositionsAttrs,
                  positions: bool = False) -> None:
    """x's rank (``[B, *, T, D]``; with per-token ``positions``, ``[B, T, H, D]``
    or ``[B, T, D]``), dims against its head dim, and the freqs operand's shape."""
    if positions and len(x.shape) not in (3, 4):
        raise ValueError(f"x must be [B, T, H, D] or [B, T, D], found {x}")
    if len(x.shape) < 3:
        raise ValueError(f"x must have rank >= 3 ([B, *, T, D]), found {x}")
    if attrs.dims > x.shape[-1]:
        raise ValueError(f"dims {attrs.dims} exceeds the head dim {x.shape[-1]} of x {x}")
    if freqs is not None and freqs.shape != (attrs.dims // 2,):
        raise ValueError(f"freqs must be [{attrs.dims // 2}] (dims / 2), found {freqs}")


def _check_rope_offset(x: AVal, offset: AVal | None, attrs: RopeFreqsAttrs) -> None:
    """An offset operand is a scalar or one per batch, given instead of the
    ``offset`` attribute."""
    if offset is None:
        return
    _check_offset(offset, "the offset operand", ((), (1,), (x.shape[0],)))
    if attrs.offset:
        raise ValueError(
            f"the offset is given twice: attribute offset={attrs.offset} and an operand"
        )


def _int32_positions(positions: mx.array) -> mx.array:
    """Integer positions as the int32 the RoPE kernels take, clamped into
    int32's range (so none wraps)."""
    if positions.dtype == mx.int32:
        return positions  # no graph node (each costs time on every replay)
    return clamp_integer(positions, _INT32.min, _INT32.max, mx.int32)


def _rope_offset(operands: list[mx.array], index: int, attrs: RopeFreqsAttrs):
    """The start position: the operand at ``index`` (as int32) if given, else
    the ``offset`` attribute."""
    if len(operands) <= index:
        return attrs.offset
    return _int32_positions(operands[index])


def _native_rope(freqs_at: int | None):
    """The native coverage of a RoPE op whose operands are x, (freqs at
    ``freqs_at``,) and an optional offset."""
    offset_at = 1 if freqs_at is None else 2

    def covers(avals, attrs) -> bool:
        offset_size = math.prod(avals[offset_at].shape) if len(avals) > offset_at else 1
        return native.covers_rope(avals[0], offset_size, attrs.dims,
                                  None if freqs_at is None else avals[freqs_at])
    return covers


def _native_rope_positions(freqs_at: int | None):
    """The native coverage of a per-token-positions RoPE op: x is run as one
    example per token (see ``_rope_at_positions``)."""

    def covers(avals, attrs) -> bool:
        shape, dtype = avals[0]
        rows = (shape[0] * shape[1], *shape[2:-1], 1, shape[-1])
        return native.covers_rope(AVal(rows, dtype), rows[0], attrs.dims,
                                  None if freqs_at is None else avals[freqs_at])
    return covers


def _check_rope(avals: list[AVal], attrs: RopeAttrs) -> None:
    """Operands x and an optional offset."""
    x, *offset = avals
    _check_rope_x(x, None, attrs)
    _check_rope_offset(x, offset[0] if offset else None, attrs)


@register_op("fast_rope", attrs=RopeAttrs, operands=(1, 2), check=_check_rope,
             native_coverage=_native_rope(None))
def fast_rope(operands, attrs):
    """Rotary position embedding of the first ``dims`` features
    (``mx.fast.rope``), frequencies ``base ** (-2i / dims)``. x is
    ``[B, *, T, D]`` with tokens on the second-to-last axis (e.g. ``[B, H, T, D]``
    or ``[B, T, D]``); token t of example b sits at position
    ``(offset + t) * scale``.

    Operands: x and an optional offset, an integer array that is a scalar or
    ``[B]`` (one start position per example, e.g. ``position_ids[:, 0]``).
    Without it the ``offset`` attribute (a constant in int32's range) is used;
    pass an operand when it changes between calls. Offset operands of any
    integer dtype are clamped into int32's range, which the kernels take.
    ``traditional=true`` rotates consecutive pairs ``(x[2i], x[2i+1])``;
    otherwise the halves ``(x[i], x[i + dims/2])``."""
    x, offset = operands[0], _rope_offset(operands, 1, attrs)
    out = native.rope(x, offset, dims=attrs.dims, traditional=attrs.traditional,
                      base=attrs.base, scale=attrs.scale, op="fast_rope")
    if out is not None:
        return out
    return mx.fast.rope(x, attrs.dims, traditional=attrs.traditional, base=attrs.base,
                        scale=attrs.scale, offset=offset)


def _check_rope_with_freqs(avals: list[AVal], attrs: RopeFreqsAttrs) -> None:
    """Operands x, freqs and an optional offset."""
    x, freqs, *offset = avals
    _check_rope_x(x, freqs, attrs)
    _check_rope_offset(x, offset[0] if offset else None, attrs)


@register_op("fast_rope_with_freqs", attrs=RopeFreqsAttrs, operands=(2, 3),
             check=_check_rope_with_freqs, native_coverage=_native_rope(1))
def fast_rope_with_freqs(operands, attrs):
    """``fast_rope`` with precomputed frequencies: operands x, freqs
    ``[dims / 2]`` and an optional offset. The angle of pair i at position p is
    ``p * scale / freqs[i]`` (``freqs`` are periods, as in ``mx.fast.rope``)."""
    x, freqs = operands[:2]
    offset = _rope_offset(operands, 2, attrs)
    out = native.rope(x, offset, dims=attrs.dims, traditional=attrs.traditional, base=1.0,
                      scale=attrs.scale, freqs=freqs, op="fast_rope_with_freqs")
    if out is not None:
        return out
    return mx.fast.rope(x, attrs.dims, traditional=attrs.traditional, base=None,
                        scale=attrs.scale, offset=offset, freqs=freqs)


def _check_positions(x: AVal, positions: AVal) -> None:
    """Positions are integer ``[B, T]``."""
    if positions.shape != x.shape[:2]:
        raise ValueError(
            f"positions must be [{x.shape[0]}, {x.shape[1]}] (batch, tokens of x), "
            f"found {positions}"
        )
    if not is_integer(positions.dtype):
        raise ValueError(f"positions must be integer, found {name_of(positions.dtype)}")


def _rope_at_positions(x, positions, attrs: RopeFreqsPositionsAttrs, base, freqs,
                       op: str) -> mx.array:
    """RoPE of x with token t of example b at ``positions[b, t]``."""
    # mx.fast.rope takes one start position per example: with every token made
    # its own example ([B * T, (H,) 1, D]) those are exactly the per-token positions.
    rows = x.reshape(-1, *x.shape[2:-1], 1, x.shape[-1])
    offsets = _int32_positions(positions.reshape(-1))
    out = native.rope(rows, offsets, dims=attrs.dims, traditional=attrs.traditional,
                      base=1.0 if base is None else base, scale=attrs.scale, freqs=freqs,
                      op=op)
    if out is None:
        out = mx.fast.rope(rows, attrs.dims, traditional=attrs.traditional, base=base,
                           scale=attrs.scale, offset=offsets, freqs=freqs)
    return out.reshape(x.shape)


def _check_rope_positions(avals: list[AVal], attrs: RopePositionsAttrs) -> None:
    """Operands x and positions."""
    x, positions = avals
    _check_rope_x(x, None, attrs, positions=True)
    _check_positions(x, positions)


@register_op("fast_rope_positions", attrs=RopePositionsAttrs, operands=2,
             check=_check_rope_positions, native_coverage=_native_rope_positions(None))
def fast_rope_positions(operands, attrs):
    """Rotary position embedding at arbitrary per-token positions (e.g. a
    left-padded prefill, or position ids with gaps), frequencies
    ``base ** (-2i / dims)``. Operands: x ``[B, T, H, D]`` (tokens before heads)
    or ``[B, T, D]``, and integer positions ``[B, T]``: token t of example b sits
    at position ``positions[b, t] * scale`` (positions clamped into int32's
    range, as ``fast_rope``'s offsets). ``traditional`` as in
    ``fast_rope``."""
    x, positions = operands
    return _rope_at_positions(x, positions, attrs, attrs.base, None, "fast_rope_positions")


def _check_rope_with_freqs_positions(avals: list[AVal],
                                     attrs: RopeFreqsPositionsAttrs) -> None:
    """Operands x, positions and freqs."""
    x, positions, freqs = avals
    _check_rope_x(x, freqs, attrs, positions=True)
    _check_positions(x, positions)


@register_op("fast_rope_with_freqs_positions", attrs=RopeFreqsPositionsAttrs, operands=3,
             check=_check_rope_with_freqs_positions,
             native_coverage=_native_rope_positions(2))
def fast_rope_with_freqs_positions(operands, attrs):
    """``fast_rope_positions`` with precomputed frequencies: operands x
    ``[B, T, H, D]`` or ``[B, T, D]``, positions ``[B, T]``, freqs ``[dims / 2]``;
    the angle of pair i is ``positions[b, t] * scale / freqs[i]`` (as in
    ``fast_rope_with_freqs``)."""
    x, positions, freqs = operands
    return _rope_at_positions(x, positions, attrs, None, freqs,
                              "fast_rope_with_freqs_positions")


# -- sampling -------------------------------------------------------------------


def _check_logits(logits: AVal) -> None:
    """Logits are a float array ``[..., V]``."""
    if not is_floating(logits.dtype) or len(logits.shape) < 1:
        raise ValueError(f"logits must be a float array [..., V], found {logits}")


@register_op("sample_greedy")
def sample_greedy(operands, attrs):
    """The most likely token: argmax over the last axis of logits ``[..., V]``,
    as int32 ids ``[...]``."""
    return mx.argmax(operands[0], axis=-1).astype(mx.int32)


class SampleAttrs(Attrs):
    """The attributes of ``sample``: temperature and the token filters."""

    temperature: NonNegativeFloat = 1.0
    top_k: PositiveInt | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    min_p: Annotated[float, Field(ge=0, lt=1)] = 0.0


def _check_sample(avals: list[AVal], attrs: SampleAttrs) -> None:
    """Float logits with at least ``top_k`` tokens, and a PRNG key."""
    logits, key = avals
    _check_logits(logits)
    if attrs.top_k is not None and attrs.top_k > logits.shape[-1]:
        raise ValueError(f"top_k {attrs.top_k} exceeds the vocabulary size {logits.shape[-1]}")
    if key.shape != (2,) or key.dtype != mx.uint32:
        raise ValueError(f"key must be a PRNG key uint32[2] (mx.random.key), found {key}")


def _scatter_flags(like: mx.array, indices: mx.array, flags: mx.array) -> mx.array:
    """A bool array shaped like ``like`` with ``flags`` at ``indices`` on the last
    axis and false elsewhere."""
    return mx.put_along_axis(mx.zeros(like.shape, mx.bool_), indices, flags, axis=-1)


@register_op("sample", attrs=SampleAttrs, operands=2, outputs=2, check=_check_sample)
def sample(operands, attrs):
    """Draw one token per row of logits ``[..., V]`` with a PRNG key operand
    (``uint32[2]``, as ``mx.random.key``). Results: int32 ids ``[...]`` and the
    next key, to feed to the following step; a given key always draws the same
    tokens.

    The logits are divided by ``temperature`` (0 means greedy: the argmax), then
    restricted to the tokens that pass every filter set, each judged on the
    tempered distribution: the ``top_k`` most likely; the smallest most-likely
    set whose probability reaches ``top_p``; those with probability at least
    ``min_p`` times the most likely one's. The most likely token always passes."""
    logits, key = operands
    draw_key, next_key = mx.random.split(key)
    if attrs.temperature == 0:
        return mx.argmax(logits, axis=-1).astype(mx.int32), next_key
    logits = logits.astype(mx.float32) * (1 / attrs.temperature)
    keep = None
    if attrs.top_k is not None and attrs.top_k < logits.shape[-1]:
        top = mx.argpartition(-logits, kth=attrs.top_k - 1, axis=-1)[..., : attrs.top_k]
        keep = _scatter_flags(logits, top, mx.array(True))
    if attrs.top_p < 1:
        order = mx.argsort(-logits, axis=-1)
        probs = mx.softmax(mx.take_along_axis(logits, order, axis=-1), axis=-1)
        before = mx.cumsum(probs, axis=-1) - probs
        nucleus = _scatter_flags(logits, order, before < attrs.top_p)
        keep = nucleus if keep is None else keep & nucleus
    if attrs.min_p > 0:
        likely = logits - logits.max(axis=-1, keepdims=True) >= math.log(attrs.min_p)
        keep = likely if keep is None else keep & likely
    if keep is not None:
        logits = mx.where(keep, logits, -mx.inf)
    ids = mx.random.categorical(logits, axis=-1, key=draw_key)
    return ids.astype(mx.int32), next_key


class RepetitionPenaltyAttrs(Attrs):
    """The attributes of ``repetition_penalty``."""

    penalty: Annotated[float, Field(gt=0)]


def _check_repetition_penalty(avals: list[AVal], attrs: RepetitionPenaltyAttrs) -> None:
    """Float logits and integer history ids with the logits' leading axes."""
    logits, history = avals
    _check_logits(logits)
    if not is_integer(history.dtype) or history.shape[:-1] != logits.shape[:-1]:
        raise ValueError(
            f"history must be integer token ids [{', '.join(map(str, logits.shape[:-1]))}"
            f"{', ' if len(logits.shape) > 1 else ''}N] matching logits {logits}, "
            f"found {history}"
        )


@register_op("repetition_penalty", attrs=RepetitionPenaltyAttrs, operands=2,
             check=_check_repetition_penalty)
def repetition_penalty(operands, attrs):
    """Make tokens already seen less likely: for each token id in history,
    a positive logit is divided by ``penalty`` and a negative one multiplied by
    it. Operands: logits ``[..., V]`` and history ``[..., N]`` (integer ids; ids
    outside ``[0, V)``, e.g. -1 for unused slots of a fixed-size history, are
    ignored)."""
    logits, history = operands
    vocab = logits.shape[-1]
    valid = (history >= 0) & (history < vocab)
    # Invalid ids go to an extra column that is dropped afterwards.
    slots = mx.where(valid, history, vocab).astype(mx.int32)
    seen = mx.zeros((*logits.shape[:-1], vocab + 1), mx.bool_)
    seen = mx.put_along_axis(seen, slots, mx.array(True), axis=-1)[..., :vocab]
    penalized = mx.where(logits > 0, logits / attrs.penalty, logits * attrs.penalty)
    return mx.where(seen, penalized, logits)
