"""Indexing ops: static and dynamic slices, slice updates, XLA-style ``gather``,
``take``, scatters (``indexed_add``/``indexed_put``), ``top_k``, ``argpartition``.

Index operands may have any integer dtype; uint64 values of 2**63 and more are
large, never negative. Reads never leave the array: ``gather``, ``take`` and
``take_along_axis`` clamp indices into range (after counting negative ones from
the end) and reject indices into an empty axis, scatters drop updates whose
index is out of range, and slice starts are clamped so the whole slice fits, as
XLA's ``dynamic_slice`` does.
"""

from __future__ import annotations

import math

import mlx.core as mx

from ..arrays import AVal, is_integer, name_of
from .attrs import Attrs, Axes, Axis, Offset, PositiveSize, Size
from .registry import register_op


def _require_integer(aval: AVal, what: str) -> None:
    if not is_integer(aval.dtype):
        raise ValueError(f"{what} must have an integer dtype; found {name_of(aval.dtype)}")


def _require_length(values, n: int, name: str, what: str) -> None:
    if values is not None and len(values) != n:
        raise ValueError(f"{name} needs one entry per {what} ({n}); found {len(values)}")


def _check_dynamic_starts(avals: list[AVal], first: int, starts, dynamic_axes) -> None:
    """Operands ``first..`` are one integer scalar per dynamic axis, and the
    static ``starts`` leave dynamic axes at 0."""
    _require_length(starts, len(avals[0].shape), "starts", "axis of operand 0")
    for axis in dynamic_axes:
        if starts is not None and starts[axis] != 0:
            raise ValueError(
                f"axis {axis} is dynamic (its start is an operand), so starts[{axis}] "
                f"must be 0; found {starts[axis]}"
            )
    operands = avals[first:]
    if len(operands) != len(dynamic_axes):
        raise ValueError(
            f"dynamic_axes {list(dynamic_axes)} needs {len(dynamic_axes)} start operand(s) "
            f"after operand {first - 1}; found {len(operands)}"
        )
    for i, aval in enumerate(operands, first):
        _require_integer(aval, f"start operand {i}")
        if aval.shape != ():
            raise ValueError(f"start operand {i} must be a scalar; found shape {list(aval.shape)}")


def clamp_integer(x: mx.array, low: int, high: int, dtype: mx.Dtype = mx.int64) -> mx.array:
    """Integer ``x`` clamped into ``[low, high]`` (which must include 0) and
    converted to ``dtype``, which must hold that range.

    The clamp happens in ``x``'s own dtype, before any conversion, so no value
    wraps: converting first would read uint64 values of 2**63 and more as
    negative, and int64 values outside ``dtype`` as their low bits."""
    info = mx.iinfo(x.dtype)
    # The bounds meet x's range (both include 0), so they are values of x's dtype.
    lo = mx.array(max(low, info.min), x.dtype)
    hi = mx.array(min(high, info.max), x.dtype)
    return mx.clip(x, lo, hi).astype(dtype)


def _clamped_start(start: mx.array, limit: int) -> mx.array:
    """A dynamic start clamped into ``[0, limit]``, as int64."""
    return clamp_integer(start, 0, limit)


def _wrap(index: mx.array, dim: int) -> mx.array:
    """Indices as int64 with negative ones counted from the end of an axis of
    ``dim``. Indices below ``-dim`` or from ``dim`` up stay out of range: they
    are first clamped into ``[-dim - 1, dim]``, so none wraps into range on the
    way to int64."""
    index = clamp_integer(index, -dim - 1, dim)
    return mx.where(index < 0, index + dim, index)


def clamp_index(index: mx.array, dim: int) -> mx.array:
    """Indices into an axis of ``dim`` (> 0) elements as int64, negative ones
    counted from the end and the rest clamped into range."""
    return mx.clip(_wrap(index, dim), 0, dim - 1)


def _index_columns(indices: mx.array) -> list[mx.array]:
    """Split ``[..., n]`` index vectors into ``n`` arrays of shape ``[...]``."""
    return [indices[..., i] for i in range(indices.shape[-1])]


def _require_readable(operand: AVal, axes, indices: int, what: str = "indices") -> None:
    """No read from an empty axis: with ``indices`` (a count) to read at, none
    of ``axes`` of ``operand`` is empty, as there is no element to clamp to."""
    empty = [a for a in axes if operand.shape[a] == 0]
    if empty and indices:
        raise ValueError(
            f"cannot read at {indices} {what} from axis {empty[0]} of operand 0 "
            f"{operand}, which is empty"
        )


def _check_index_vectors(indices: AVal, axes) -> None:
    """``indices`` (operand 1) holds integer index vectors, one component per axis."""
    if not axes:
        raise ValueError("axes must name at least one axis")
    _require_integer(indices, "indices (operand 1)")
    if not indices.shape or indices.shape[-1] != len(axes):
        raise ValueError(
            f"indices (operand 1) must have shape [..., {len(axes)}] (one index per axis in "
            f"axes {list(axes)}); found {list(indices.shape)}"
        )


class SliceAttrs(Attrs):
    lengths: list[Size]
    """Length of the slice along each axis, before striding."""
    starts: list[Offset] | None = None
    """Static start per axis (default 0); clamped into ``[0, dim - length]``."""
    strides: list[PositiveSize] | None = None
    """Step per axis (default 1); the result has ``ceil(length / stride)`` elements."""
    dynamic_axes: Axes = []
    """Axes whose start is an operand (one integer scalar each, in this order)."""


def _check_slice(avals: list[AVal], attrs: SliceAttrs) -> None:
    """Lengths and strides per axis, each length within its dimension, and
    one integer scalar start operand per dynamic axis."""
    shape = avals[0].shape
    _require_length(attrs.lengths, len(shape), "lengths", "axis of operand 0")
    _require_length(attrs.strides, len(shape), "strides", "axis of operand 0")
    for axis, (length, dim) in enumerate(zip(attrs.lengths, shape)):
        if length > dim:
            raise ValueError(f"lengths[{axis}] = {length} exceeds dimension {dim} of operand 0")
    _check_dynamic_starts(avals, 1, attrs.starts, attrs.dynamic_axes)


@register_op("slice", attrs=SliceAttrs, operands=(1, None), check=_check_slice)
def slice_(operands, attrs):
    """Slice of ``lengths`` elements per axis from operand 0, taking every
    ``strides``-th one. Operands: the array, then one integer scalar start per
    axis of ``dynamic_axes``; other axes start at ``starts`` (default 0). Every
    start, static or dynamic, is clamped into ``[0, dim - length]`` so the slice
    always fits (a negative start reads from 0, a too-large one from the end),
    as XLA's ``dynamic_slice``. Result shape: ``ceil(length / stride)`` per axis.
    """
    x = operands[0]
    n = x.ndim
    starts = attrs.starts or [0] * n
    strides = attrs.strides or [1] * n
    dynamic = list(attrs.dynamic_axes)
    if dynamic:
        limits = [x.shape[a] - attrs.lengths[a] for a in dynamic]
        start = mx.stack([_clamped_start(s, lim) for s, lim in zip(operands[1:], limits)])
        size = [attrs.lengths[a] if a in dynamic else d for a, d in enumerate(x.shape)]
        x = mx.slice(x, start, dynamic, size)
    index = []
    for axis, (dim, start, length, stride) in enumerate(
        zip(x.shape, starts, attrs.lengths, strides)
    ):
        begin = 0 if axis in dynamic else min(max(start, 0), dim - length)
        # A stride beyond the length takes the first element only, as the
        # length itself does; MLX's own size arithmetic overflows int32 on a
        # stride near 2**31.
        index.append(slice(begin, begin + length, min(stride, max(length, 1))))
    return x[tuple(index)]


class PutSliceAttrs(Attrs):
    starts: list[Offset] | None = None
    """Static start per axis (default 0); clamped into ``[0, dim - update dim]``."""
    dynamic_axes: Axes = []
    """Axes whose start is an operand (one integer scalar each, in this order)."""


def _check_put_slice(avals: list[AVal], attrs: PutSliceAttrs) -> None:
    """The update fits inside the input, and one integer scalar start operand
    follows per dynamic axis."""
    shape, update = avals[0].shape, avals[1].shape
    if len(update) != len(shape) or any(u > d for u, d in zip(update, shape)):
        raise ValueError(
            f"update (operand 1) must have the rank of the input {list(shape)} and fit "
            f"inside it; found {list(update)}"
        )
    _check_dynamic_starts(avals, 2, attrs.starts, attrs.dynamic_axes)


@register_op("put_slice", attrs=PutSliceAttrs, operands=(2, None), check=_check_put_slice)
def put_slice(operands, attrs):
    """Write ``update`` into ``input`` at a start position (XLA's
    ``dynamic_update_slice``). Operands: input, update (same rank, each dimension
    at most the input's), then one integer scalar start per axis of
    ``dynamic_axes``; other axes start at ``starts`` (default 0). Every start is
    clamped into ``[0, dim - update dim]``, so the update always lands whole. The
    update is converted to the input's dtype; the result has the input's shape.
    """
    x, update = operands[0], operands[1]
    starts = attrs.starts or [0] * x.ndim
    dynamic = dict(zip(attrs.dynamic_axes, operands[2:]))
    components = []
    for axis, (dim, size, start) in enumerate(zip(x.shape, update.shape, starts)):
        if axis in dynamic:
            components.append(_clamped_start(dynamic[axis], dim - size))
        else:
            components.append(mx.array(min(max(start, 0), dim - size), dtype=mx.int64))
    return mx.slice_update(x, update, mx.stack(components), list(range(x.ndim)))


class GatherAttrs(Attrs):
    axes: Axes
    """The axes of operand 0 that the index vectors address, in index-vector order."""
    slice_sizes: list[Size] | None = None
    """Slice size per axis of operand 0 (1 on gathered axes); default: whole axes."""


def _check_gather(avals: list[AVal], attrs: GatherAttrs) -> None:
    """Index vectors with one component per axis in ``axes``, none into an
    empty axis, and slice sizes (when given) of 1 on gathered axes and within
    every dimension."""
    _check_index_vectors(avals[1], attrs.axes)
    _require_readable(avals[0], attrs.axes, math.prod(avals[1].shape[:-1]), "index vectors")
    if attrs.slice_sizes is None:
        return
    shape = avals[0].shape
    _require_length(attrs.slice_sizes, len(shape), "slice_sizes", "axis of operand 0")
    for axis, (size, dim) in enumerate(zip(attrs.slice_sizes, shape)):
        if axis in attrs.axes and size != 1:
            raise ValueError(f"slice_sizes[{axis}] must be 1 (a gathered axis); found {size}")
        if size > dim:
            raise ValueError(f"slice_sizes[{axis}] = {size} exceeds dimension {dim}")


@register_op("gather", attrs=GatherAttrs, operands=2, check=_check_gather)
def gather(operands, attrs):
    """XLA-style gather with index vectors. Operands: ``tensor`` and ``indices``
    of shape ``[..., len(axes)]``; index vector component ``i`` addresses axis
    ``axes[i]``. Result shape: ``indices.shape[:-1]`` followed by the
    ``slice_sizes`` of the axes not in ``axes``, in axis order (the gathered axes
    are collapsed). So with ``slice_sizes`` omitted, ``result[b..., r...] =
    tensor[...]`` at ``indices[b..., i]`` on axis ``axes[i]`` and ``r`` on the
    others. Negative indices count from the end; out-of-range ones are clamped.
    Index vectors into an empty axis are rejected, as in ``take``.
    """
    x, indices = operands
    axes = list(attrs.axes)
    rest = [a for a in range(x.ndim) if a not in axes]
    if attrs.slice_sizes is not None:
        sizes = enumerate(attrs.slice_sizes)
        x = x[tuple(slice(None) if a in axes else slice(0, s) for a, s in sizes)]
    columns = [clamp_index(c, x.shape[a]) for c, a in zip(_index_columns(indices), axes)]
    return mx.transpose(x, axes + rest)[tuple(columns)]


class TakeAttrs(Attrs):
    axis: Axis | None = None
    """The axis to index; null indexes the flattened array."""


def _check_take(avals: list[AVal], attrs: TakeAttrs) -> None:
    """Integer indices (operand 1), none into an empty axis."""
    _require_integer(avals[1], "indices (operand 1)")
    x, indices = avals
    # The flattened array (axis null) is empty where any axis is.
    axes = range(len(x.shape)) if attrs.axis is None else [attrs.axis]
    _require_readable(x, axes, math.prod(indices.shape))


@register_op("take", attrs=TakeAttrs, operands=2, check=_check_take)
def take(operands, attrs):
    """Elements of operand 0 at ``indices`` along ``axis`` (``mx.take``); the
    indexed axis is replaced by the indices' shape. ``axis`` null indexes the
    flattened array. Negative indices count from the end; out-of-range ones are
    clamped. Indices into an empty axis (or an empty flattened array) are
    rejected: there is no element to clamp to."""
    x, indices = operands
    dim = x.size if attrs.axis is None else x.shape[attrs.axis]
    return mx.take(x, clamp_index(indices, dim), axis=attrs.axis)


class TakeAlongAxisAttrs(Attrs):
    axis: Axis
    """The axis to index."""


def _check_take_along_axis(avals: list[AVal], attrs: TakeAlongAxisAttrs) -> None:
    """Integer indices (operand 1), none into an empty axis (as ``take``)."""
    _require_integer(avals[1], "indices (operand 1)")
    _require_readable(avals[0], [attrs.axis], math.prod(avals[1].shape))


@register_op("take_along_axis", attrs=TakeAlongAxisAttrs, operands=2,
             check=_check_take_along_axis)
def take_along_axis(operands, attrs):
    """``mx.take_along_axis``: ``indices`` has operand 0's rank and broadcasts
    with it on the other axes. Negative indices count from the end; out-of-range
    ones are clamped. Indices into an empty axis are rejected, as in ``take``."""
    x, indices = operands
    return mx.take_along_axis(x, clamp_index(indices, x.shape[attrs.axis]), attrs.axis)


class IndexedAttrs(Attrs):
    axes: Axes
    """The axes of the target that the index vectors address, in index-vector order."""


def _check_indexed(avals: list[AVal], attrs: IndexedAttrs) -> None:
    """Index vectors with one component per axis in ``axes``, and one update
    slice per index vector (``indexed_add``, ``indexed_put``)."""
    _check_index_vectors(avals[1], attrs.axes)
    target, indices, updates = avals
    rest = (d for a, d in enumerate(target.shape) if a not in attrs.axes)
    expected = [*indices.shape[:-1], *rest]
    if list(updates.shape) != expected:
        raise ValueError(
            f"updates (operand 2) must have shape {expected} (indices' batch shape, then "
            f"the target's axes not in axes); found {list(updates.shape)}"
        )


def _scatter(operands, attrs, combine):
    """Scatter ``updates`` into ``target`` with ``combine(target_view, index, updates)``.

    The indexed axes move to the front and grow by one trailing slot each; updates
    with an out-of-range index are sent there and cut off with it.
    """
    target, indices, updates = operands
    axes = list(attrs.axes)
    perm = axes + [a for a in range(target.ndim) if a not in axes]
    moved = mx.transpose(target, perm)
    dims = moved.shape[: len(axes)]
    wrapped = [_wrap(c, d) for c, d in zip(_index_columns(indices), dims)]
    valid = mx.array(True)
    for c, d in zip(wrapped, dims):
        valid = valid & (c >= 0) & (c < d)
    columns = tuple(mx.where(valid, c, d) for c, d in zip(wrapped, dims))
    padded = mx.pad(moved, [(0, 1)] * len(axes) + [(0, 0)] * (target.ndim - len(axes)))
    scattered = combine(padded, columns, updates)
    kept = scattered[tuple(slice(0, d) for d in dims)]
    inverse = sorted(range(target.ndim), key=perm.__getitem__)
    return mx.transpose(kept, inverse)


def _add_at(array, index, updates):
    return array.at[index].add(updates)


def _put_at(array, index, updates):
    array[index] = updates  # `array` is a fresh local array: nothing else sees this
    return array


@register_op("indexed_add", attrs=IndexedAttrs, operands=3, check=_check_indexed)
def indexed_add(operands, attrs):
    """Scatter-add: operands ``target``, ``indices`` of shape ``[..., len(axes)]``
    and ``updates`` of shape ``indices.shape[:-1]`` + the target's dimensions not
    in ``axes``. Each index vector (component ``i`` on axis ``axes[i]``) selects
    a slice of the target that its update is added to; repeated indices
    accumulate. Negative indices count from the end; updates at out-of-range
    indices are dropped. Result: the target's shape and dtype."""
    return _scatter(operands, attrs, _add_at)


@register_op("indexed_put", attrs=IndexedAttrs, operands=3, check=_check_indexed)
def indexed_put(operands, attrs):
    """Scatter-replace, operands and shapes as ``indexed_add``: each update
    replaces the slice its index vector selects. Where index vectors repeat,
    which update lands is unspecified. Negative indices count from the end;
    updates at out-of-range indices are dropped."""
    return _scatter(operands, attrs, _put_at)


def _descending_key(x: mx.array) -> mx.array:
    """An array whose ascending order is ``x``'s descending order, for any dtype
    (bitwise complement reverses integer order without overflow)."""
    if x.dtype == mx.bool_:
        return mx.logical_not(x)
    if is_integer(x.dtype):
        return mx.bitwise_invert(x)
    return -x


class TopKAttrs(Attrs):
    k: PositiveSize
    """How many of the largest elements to return; at most the last dimension."""


def _check_top_k(avals: list[AVal], attrs: TopKAttrs) -> None:
    """The operand has a last axis of at least ``k`` elements."""
    shape = avals[0].shape
    if not shape or attrs.k > shape[-1]:
        last = shape[-1] if shape else "none (a scalar)"
        raise ValueError(f"k = {attrs.k} must be at most the last dimension; found {last}")


@register_op("top_k", attrs=TopKAttrs, outputs=2, check=_check_top_k)
def top_k(operands, attrs):
    """The ``k`` largest elements along the last axis, in descending order, and
    their indices (uint32, as MLX's arg-sorts). Two results: values (operand 0's
    dtype) and indices, each of shape ``[..., k]``. NaN ranks below every number;
    the order of equal elements is unspecified."""
    x = operands[0]
    key = _descending_key(x)
    candidates = mx.argpartition(key, kth=attrs.k - 1, axis=-1)[..., : attrs.k]
    order = mx.argsort(mx.take_along_axis(key, candidates, axis=-1), axis=-1)
    indices = mx.take_along_axis(candidates, order, axis=-1)
    return mx.take_along_axis(x, indices, axis=-1), indices


class ArgpartitionAttrs(Attrs):
    kth: Offset
    """The sorted position whose element lands in place; negative counts from the end."""
    axis: Axis = -1
    """The axis to partition."""


def _check_argpartition(avals: list[AVal], attrs: ArgpartitionAttrs) -> None:
    """``kth`` is a position along ``axis`` (which axis resolution has
    checked exists, so a scalar operand never gets here)."""
    dim = avals[0].shape[attrs.axis]
    if not -dim <= attrs.kth < dim:
        raise ValueError(f"kth = {attrs.kth} is out of range for an axis of size {dim}")


@register_op("argpartition", attrs=ArgpartitionAttrs, check=_check_argpartition)
def argpartition(operands, attrs):
    """Indices (uint32) that partition operand 0 along ``axis``: the element at
    position ``kth`` is the one a sort would put there, those before it are no
    larger and those after no smaller, each side in unspecified order
    (``mx.argpartition``)."""
    x = operands[0]
    return mx.argpartition(x, kth=attrs.kth % x.shape[attrs.axis], axis=attrs.axis)
