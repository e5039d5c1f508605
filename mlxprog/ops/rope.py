"""Rotary position embeddings (``mx.fast.rope``): from a start offset or at
per-token positions, with frequencies from a base or given as an operand."""

from __future__ import annotations

import math
from typing import Annotated

import mlx.core as mx
from pydantic import Field, model_validator

from ..arrays import AVal, is_integer, name_of
from ..native import kernels as native
from .attrs import Attrs, PositiveSize
from .positions import _INT32, _check_offset, _int32_positions
from .registry import register_op


class RopeFreqsPositionsAttrs(Attrs):
    """The attributes of ``fast_rope_with_freqs_positions``, which every RoPE op takes."""

    dims: PositiveSize
    traditional: bool = False
    scale: float = 1.0
    rotated_scale: Annotated[float, Field(allow_inf_nan=False)] = 1.0
    """A factor on the ``dims`` rotated features, applied before the rotation;
    the rest pass unchanged (Phi-3's LongRoPE attention factor)."""

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


def _scale_rotated(x: mx.array, attrs: RopeFreqsPositionsAttrs) -> mx.array:
    """x with its first ``dims`` features multiplied by ``rotated_scale`` (as
    mlx-lm's SuScaledRoPE does before ``mx.fast.rope``)."""
    if attrs.rotated_scale == 1.0:
        return x  # no graph node (each costs time on every replay)
    if attrs.dims == x.shape[-1]:
        return x * attrs.rotated_scale
    factors = mx.concatenate([mx.full((attrs.dims,), attrs.rotated_scale, x.dtype),
                              mx.ones((x.shape[-1] - attrs.dims,), x.dtype)])
    return x * factors


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


@register_op("fast_rope", attrs=RopeAttrs, operands=(1, 2), check=_check_rope, context=True,
             native_coverage=_native_rope(None))
def fast_rope(operands, attrs, context):
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
    otherwise the halves ``(x[i], x[i + dims/2])``. With ``rotated_scale``
    the ``dims`` rotated features are multiplied by it before the rotation
    (Phi-3's LongRoPE attention factor); the other features pass unchanged,
    in every RoPE op."""
    x, offset = _scale_rotated(operands[0], attrs), _rope_offset(operands, 1, attrs)
    out = native.rope(context.native, x, offset, dims=attrs.dims,
                      traditional=attrs.traditional, base=attrs.base, scale=attrs.scale,
                      op="fast_rope")
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
             check=_check_rope_with_freqs, native_coverage=_native_rope(1), context=True)
def fast_rope_with_freqs(operands, attrs, context):
    """``fast_rope`` with precomputed frequencies: operands x, freqs
    ``[dims / 2]`` and an optional offset. The angle of pair i at position p is
    ``p * scale / freqs[i]`` (``freqs`` are periods, as in ``mx.fast.rope``)."""
    x, freqs = _scale_rotated(operands[0], attrs), operands[1]
    offset = _rope_offset(operands, 2, attrs)
    out = native.rope(context.native, x, offset, dims=attrs.dims,
                      traditional=attrs.traditional, base=1.0, scale=attrs.scale, freqs=freqs,
                      op="fast_rope_with_freqs")
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
                       op: str, context) -> mx.array:
    """RoPE of x with token t of example b at ``positions[b, t]`` (``context``:
    the calling op's, for the native kernel)."""
    # mx.fast.rope takes one start position per example: with every token made
    # its own example ([B * T, (H,) 1, D]) those are exactly the per-token positions.
    rows = _scale_rotated(x, attrs).reshape(-1, *x.shape[2:-1], 1, x.shape[-1])
    offsets = _int32_positions(positions.reshape(-1))
    out = native.rope(context.native, rows, offsets, dims=attrs.dims,
                      traditional=attrs.traditional, base=1.0 if base is None else base,
                      scale=attrs.scale, freqs=freqs, op=op)
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
             check=_check_rope_positions, native_coverage=_native_rope_positions(None),
             context=True)
def fast_rope_positions(operands, attrs, context):
    """Rotary position embedding at arbitrary per-token positions (e.g. a
    left-padded prefill, or position ids with gaps), frequencies
    ``base ** (-2i / dims)``. Operands: x ``[B, T, H, D]`` (tokens before heads)
    or ``[B, T, D]``, and integer positions ``[B, T]``: token t of example b sits
    at position ``positions[b, t] * scale`` (positions clamped into int32's
    range, as ``fast_rope``'s offsets). ``traditional`` as in
    ``fast_rope``."""
    x, positions = operands
    return _rope_at_positions(x, positions, attrs, attrs.base, None, "fast_rope_positions",
                              context)


def _check_rope_with_freqs_positions(avals: list[AVal],
                                     attrs: RopeFreqsPositionsAttrs) -> None:
    """Operands x, positions and freqs."""
    x, positions, freqs = avals
    _check_rope_x(x, freqs, attrs, positions=True)
    _check_positions(x, positions)


@register_op("fast_rope_with_freqs_positions", attrs=RopeFreqsPositionsAttrs, operands=3,
             check=_check_rope_with_freqs_positions,
             native_coverage=_native_rope_positions(2), context=True)
def fast_rope_with_freqs_positions(operands, attrs, context):
    """``fast_rope_positions`` with precomputed frequencies: operands x
    ``[B, T, H, D]`` or ``[B, T, D]``, positions ``[B, T]``, freqs ``[dims / 2]``;
    the angle of pair i is ``positions[b, t] * scale / freqs[i]`` (as in
    ``fast_rope_with_freqs``)."""
    x, positions, freqs = operands
    return _rope_at_positions(x, positions, attrs, None, freqs,
                              "fast_rope_with_freqs_positions", context)
