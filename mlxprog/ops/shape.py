"""Shape and movement ops: reshape, squeeze, expand_dims, transpose, broadcasts,
pad, reverse, concatenate, stack, split, flatten. None of them changes values or
dtypes (except where operands of different dtypes are joined, which promotes
like MLX).

``expand_dims``, ``transpose``, ``concatenate``, ``stack`` and ``flatten`` are
shapeless (one trace serves every binding of a symbolic program). The others
are not: their attributes fix sizes or index ranges, and ``squeeze``'s default
depends on which sizes happen to be 1.
"""

from __future__ import annotations

import math
from typing import Annotated

import mlx.core as mx
from pydantic import Field, ValidationInfo, field_validator

from ..arrays import AVal
from ..limits import MAX_DIM
from .attrs import Attrs, Axes, Axis, AxisOf, CheckError, InsertAxis, Offset, Size, normalize_axis
from .registry import register_op


class ReshapeAttrs(Attrs):
    shape: list[Annotated[int, Field(ge=-1, le=MAX_DIM)]]
    """The result shape; at most one -1, inferred from the element count."""

    @field_validator("shape")
    @classmethod
    def _one_inferred(cls, shape: list[int]) -> list[int]:
        if shape.count(-1) > 1:
            raise ValueError(f"shape {shape} has more than one -1 (at most one size is inferred)")
        return shape


def _check_reshape(avals: list[AVal], attrs: ReshapeAttrs) -> None:
    """The element count does not change (a -1 size must make it come out whole)."""
    operand, shape = list(avals[0].shape), attrs.shape
    size = math.prod(operand)
    known = math.prod(d for d in shape if d != -1)
    if -1 not in shape and known != size:
        raise CheckError(
            f"cannot reshape {operand} ({size} elements) into {shape} ({known} elements)",
            attribute="shape",
        )
    if -1 in shape and (known == 0 or size % known):
        raise CheckError(
            f"cannot reshape {operand} ({size} elements) into {shape}: no size for "
            f"the -1 makes {size} elements",
            attribute="shape",
        )


@register_op("reshape", attrs=ReshapeAttrs, check=_check_reshape)
def reshape(operands, attrs):
    """Give the elements a new ``shape`` (row-major order). One size may be -1: it
    is inferred from the element count, which must not change."""
    return mx.reshape(operands[0], attrs.shape)


class SqueezeAttrs(Attrs):
    axes: Axes | None = None
    """Size-1 axes to remove; default: every size-1 axis."""


@register_op("squeeze", attrs=SqueezeAttrs)
def squeeze(operands, attrs):
    """Remove size-1 ``axes`` (default: every size-1 axis). Naming an axis whose
    size is not 1 is an error."""
    return mx.squeeze(operands[0], attrs.axes)


ResultAxes = Annotated[list[int], AxisOf(many=True, added_per_axis=True, of="a result")]
"""Distinct axes of a result that has one more axis than operand 0 per axis
named (``expand_dims``)."""


class ExpandDimsAttrs(Attrs):
    axes: ResultAxes
    """Where the new axes go, as distinct axes of the result; negative counts
    from the end."""


@register_op("expand_dims", attrs=ExpandDimsAttrs, shapeless=True)
def expand_dims(operands, attrs):
    """Insert size-1 axes at ``axes``, which count in the result's rank (the
    operand's rank plus the number of axes inserted)."""
    return mx.expand_dims(operands[0], attrs.axes)


class TransposeAttrs(Attrs):
    axes: Axes | None = None
    """A permutation of all axes: result axis i is operand axis ``axes[i]``;
    default: reversed."""


def _check_transpose(avals: list[AVal], attrs: TransposeAttrs) -> None:
    """``axes`` (distinct, in range) names every axis of the operand."""
    ndim = len(avals[0].shape)
    if attrs.axes is not None and len(attrs.axes) != ndim:
        raise CheckError(
            f"axes {list(attrs.axes)} must be a permutation of all {ndim} axes of the operand",
            attribute="axes",
        )


@register_op("transpose", attrs=TransposeAttrs, check=_check_transpose, shapeless=True)
def transpose(operands, attrs):
    """Permute the axes: result axis i is operand axis ``axes[i]`` (default:
    reverse the axes)."""
    return mx.transpose(operands[0], attrs.axes)


class BroadcastAttrs(Attrs):
    shape: list[Size]
    """The result shape."""
    axes: list[int]
    """The result axis of each operand axis, distinct; negative counts from the
    end of ``shape``."""

    @field_validator("axes")
    @classmethod
    def _placement(cls, axes: list[int], info: ValidationInfo) -> tuple[int, ...]:
        # The axes count in ``shape``, an attribute, so the model normalises them.
        target = info.data.get("shape")
        if target is None:  # the shape itself was invalid; that error is reported
            return tuple(axes)
        normalized = tuple(normalize_axis(a, len(target), of="a result") for a in axes)
        if len(set(normalized)) != len(normalized):
            raise ValueError(f"axes {axes} name an axis twice")
        return normalized


def _check_broadcast(avals: list[AVal], attrs: BroadcastAttrs) -> None:
    """One result axis per operand axis, each of the operand axis's size or
    the operand axis of size 1."""
    operand, target = avals[0].shape, attrs.shape
    if len(attrs.axes) != len(operand):
        raise CheckError(
            f"axes {list(attrs.axes)} must give one result axis per operand axis; "
            f"the operand has shape {list(operand)}",
            attribute="axes",
        )
    for i, (size, axis) in enumerate(zip(operand, attrs.axes)):
        if size not in (1, target[axis]):
            raise CheckError(
                f"operand axis {i} (size {size}) cannot broadcast to result axis "
                f"{axis} (size {target[axis]}) of shape {target}",
                attribute="axes",
            )


@register_op("broadcast", attrs=BroadcastAttrs, check=_check_broadcast)
def broadcast(operands, attrs):
    """Broadcast to ``shape``, placing operand axis i at result axis ``axes[i]``
    (XLA ``broadcast_in_dim``); every other result axis is new. Each operand axis
    must have size 1 or the size of its result axis."""
    x = operands[0]
    by_target = sorted(range(x.ndim), key=lambda i: attrs.axes[i])
    if by_target != list(range(x.ndim)):
        x = mx.transpose(x, by_target)
    placed = [1] * len(attrs.shape)
    for axis, size in zip(sorted(attrs.axes), x.shape):
        placed[axis] = size
    return mx.broadcast_to(mx.reshape(x, placed), attrs.shape)


class BroadcastToAttrs(Attrs):
    shape: list[Size]
    """The result shape."""


@register_op("broadcast_to", attrs=BroadcastToAttrs)
def broadcast_to(operands, attrs):
    """Broadcast to ``shape`` with numpy rules (trailing axes aligned)."""
    return mx.broadcast_to(operands[0], attrs.shape)


class PadAttrs(Attrs):
    pad_width: list[tuple[Offset, Offset]]
    """``[low, high]`` per operand axis: elements added before and after;
    negative values crop."""


def _check_pad(avals: list[AVal], attrs: PadAttrs) -> None:
    """A ``[low, high]`` pair per axis of x that crops no more than the axis
    holds, and a scalar pad value."""
    shape, pad_width = avals[0].shape, attrs.pad_width
    if len(pad_width) != len(shape):
        raise CheckError(
            f"needs one [low, high] pair per operand axis ({len(shape)}), found {len(pad_width)}",
            attribute="pad_width",
        )
    for axis, ((low, high), size) in enumerate(zip(pad_width, shape)):
        if low + size + high < 0:
            raise CheckError(
                f"[{low}, {high}] on axis {axis} of size {size} crops more than the axis holds",
                attribute="pad_width",
            )
    if avals[1].shape != ():
        raise ValueError(f"the pad value must be a scalar; found shape {list(avals[1].shape)}")


@register_op("pad", attrs=PadAttrs, operands=2, check=_check_pad)
def pad(operands, attrs):
    """Pad with a constant (operands: x, a scalar pad value, cast to x's dtype).
    ``pad_width`` holds a ``[low, high]`` pair per axis: how many elements to add
    before and after. Negative values crop instead, as in XLA's ``pad``."""
    x, value = operands
    grow = [(max(low, 0), max(high, 0)) for low, high in attrs.pad_width]
    padded = mx.pad(x, grow, constant_values=value)
    # Cropping after growing handles a side that both grows and is cropped into.
    crop = tuple(
        slice(max(-low, 0), size - max(-high, 0))
        for (low, high), size in zip(attrs.pad_width, padded.shape)
    )
    return padded[crop]


class ReverseAttrs(Attrs):
    axes: Axes
    """The axes to reverse."""


@register_op("reverse", attrs=ReverseAttrs)
def reverse(operands, attrs):
    """Reverse the order of elements along ``axes``."""
    x = operands[0]
    return x[tuple(slice(None, None, -1 if a in attrs.axes else 1) for a in range(x.ndim))]


class ConcatenateAttrs(Attrs):
    axis: Axis = 0
    """The axis to join along."""


@register_op("concatenate", attrs=ConcatenateAttrs, operands=(1, None),
             shapeless=True)
def concatenate(operands, attrs):
    """Join the operands along ``axis``; all other sizes must match. Dtypes
    promote like MLX."""
    return mx.concatenate(operands, axis=attrs.axis)


class StackAttrs(Attrs):
    axis: InsertAxis = 0
    """The new axis, counted in the result's rank."""


@register_op("stack", attrs=StackAttrs, operands=(1, None), shapeless=True)
def stack(operands, attrs):
    """Stack same-shaped operands along a new axis ``axis`` of the result (which
    has one more axis than each operand). Dtypes promote like MLX."""
    return mx.stack(operands, axis=attrs.axis)


class SplitAttrs(Attrs):
    indices_or_sections: int | list[Offset]
    """A number of equal parts (at least 1), or the indices where parts start."""
    axis: Axis = 0
    """The axis to split."""

    @field_validator("indices_or_sections")
    @classmethod
    def _some_sections(cls, value: int | list[int]) -> int | list[int]:
        # The list arm is bounded by its type; a count is checked here, to
        # say what a count must be.
        if isinstance(value, int) and not 1 <= value <= MAX_DIM:
            raise ValueError(f"{value} sections: there must be at least 1 and at most {MAX_DIM}")
        return value


def _split_outputs(attrs: SplitAttrs, n_operands: int) -> int:
    if isinstance(attrs.indices_or_sections, int):
        return attrs.indices_or_sections
    return len(attrs.indices_or_sections) + 1


@register_op("split", attrs=SplitAttrs, outputs=_split_outputs)
def split(operands, attrs):
    """Split along ``axis``: an int ``indices_or_sections`` makes that many equal
    parts (the axis must divide evenly); a list gives the indices where parts
    start, making one more part than indices (as ``numpy.split``)."""
    return tuple(mx.split(operands[0], attrs.indices_or_sections, axis=attrs.axis))


FlattenAxis = Annotated[int, AxisOf(at_least=1)]
"""An axis of operand 0, which counts as rank 1 when a scalar: a scalar
flattens to shape [1], so it accepts the axes of a rank-1 array."""


class FlattenAttrs(Attrs):
    start_axis: FlattenAxis = 0
    """The first axis to merge; negative counts from the end."""
    end_axis: FlattenAxis = -1
    """The last axis to merge (inclusive); negative counts from the end."""


@register_op("flatten", attrs=FlattenAttrs, shapeless=True)
def flatten(operands, attrs):
    """Merge axes ``start_axis`` through ``end_axis`` (inclusive) into one."""
    return mx.flatten(operands[0], attrs.start_axis, attrs.end_axis)
