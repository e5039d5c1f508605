"""Indexing ops: Gather, GatherElements, GatherND, ScatterElements,
ScatterND, TopK, ReverseSequence, TensorScatter.

Indices may be negative (counted from the end). Out-of-range indices, an
error in ONNX, are clamped by MLX's gathers and dropped by its scatters.
Scatter reductions ``mul``/``max``/``min`` (MLX has scatter-replace and
scatter-add only) are computed densely, with a one-hot mask. ReverseSequence
and TensorScatter (a KV cache write) are gathers of index arrays built from
iotas, TensorScatter's selected into the cache.
NonZero (a data-dependent shape) is not converted.
"""

from __future__ import annotations

import numpy as np

from .. import shape_rules
from ..context import Context
from ..dtypes import dtype_name, is_float_dtype
from ..registry import converter
from .shape import _axis, _is_int, _symbolic, folded, prod

_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _index_dtype(ctx: Context, i: int) -> str:
    return "int64" if np.dtype(ctx.dtype(i)) == np.int64 else "int32"


@converter("Gather", shape_rule=shape_rules.GATHER)
def gather(ctx: Context) -> list:
    """``take`` along ``axis``: the axis is replaced by the indices' shape."""
    rank = len(ctx.shape(0))
    axis = _axis(ctx, ctx.attr("axis", 0), rank)
    data, indices = ctx.constant(0), ctx.constant(1)
    if _symbolic(data) and indices is not None:  # Shape -> Gather of symbolic dims
        return [folded(np.take(data, np.asarray(indices, np.int64), axis=axis))]
    return [ctx.b.take(ctx.input(0), ctx.input(1), axis=axis)]


@converter("GatherElements")
def gather_elements(ctx: Context) -> list:
    """``out[i..] = data[i.. with indices[i..] on axis]``: the output has the
    indices' shape (each axis at most the data's)."""
    dims = list(ctx.shape(0))
    idims = list(ctx.shape(1))
    if len(dims) != len(idims):
        raise ctx.fail("data and indices must have the same rank")
    axis = _axis(ctx, ctx.attr("axis", 0), len(dims))
    x = ctx.input(0)
    lengths = [d if a == axis else i for a, (d, i) in enumerate(zip(dims, idims))]
    if lengths != dims:
        x = ctx.b.slice(x, lengths=lengths)
    return [ctx.b.take_along_axis(x, ctx.input(1), axis=axis)]


def _iota_coords(ctx: Context, shape: list, count: int, dtype: str):
    """``count`` index arrays of ``shape + [1]``, coordinate j along axis j."""
    return [ctx.b.iota(shape=[*shape, 1], dtype=dtype, axis=j) for j in range(count)]


@converter("GatherND")
def gather_nd(ctx: Context) -> list:
    """Index vectors (the indices' last axis, length k) into the data's axes
    after the first ``batch_dims`` (which data and indices share)."""
    dims = list(ctx.shape(0))
    idims = list(ctx.shape(1))
    bd = ctx.attr("batch_dims", 0)
    k = idims[-1]
    if not _is_int(k):
        raise ctx.fail("the index vector length (the indices' last dim) must be static")
    if bd + k > len(dims):
        raise ctx.fail(f"batch_dims {bd} + index length {k} exceed the data's rank")
    b = ctx.b
    idx = ctx.input(1)
    dtype = _index_dtype(ctx, 1)
    if bd:
        coords = _iota_coords(ctx, idims[:-1], bd, dtype)
        idx = b.concatenate(*coords, idx, axis=-1)
    if k == 0 and not bd:
        # Whole data per index vector: broadcast it.
        lead = idims[:-1]
        x = b.expand_dims(ctx.input(0), axes=list(range(len(lead)))) if lead else ctx.input(0)
        return [b.broadcast_to(x, shape=[*lead, *dims])]
    return [b.gather(ctx.input(0), idx, axes=list(range(bd + k)))]


def _scatter(ctx: Context, data, idx, updates, axes: list[int], reduction: str):
    b = ctx.b
    if reduction == "none":
        return b.indexed_put(data, idx, updates, axes=axes)
    if reduction == "add":
        return b.indexed_add(data, idx, updates, axes=axes)
    raise ctx.fail(f"reduction={reduction!r}: no scatter op")  # handled densely


def _identity(ctx: Context, reduction: str, dtype: np.dtype):
    """The identity element of a scatter reduction, as a ``full`` value."""
    if reduction == "mul":
        return True if dtype == np.bool_ else 1
    if dtype == np.bool_:
        return reduction == "min"
    if is_float_dtype(dtype):
        return "-inf" if reduction == "max" else "inf"
    info = np.iinfo(dtype)
    return int(info.min if reduction == "max" else info.max)


def _combine(ctx: Context, reduction: str, a, c, dtype: np.dtype):
    b = ctx.b
    if dtype == np.bool_:
        return b.logical_or(a, c) if reduction == "max" else b.logical_and(a, c)
    if reduction == "mul":
        return b.multiply(a, c)
    return b.max(a, c) if reduction == "max" else b.min(a, c)


def _reduce(ctx: Context, reduction: str, x, axis: int):
    b = ctx.b
    if reduction == "mul":
        return b.product(x, axes=[axis])
    return (b.reduce_max if reduction == "max" else b.reduce_min)(x, axes=[axis])


def _dense_reduce(ctx: Context, reduction: str, mask, updates, dtype: np.dtype, axis: int):
    """``updates`` (broadcast against ``mask``) where ``mask``, the reduction's
    identity elsewhere, reduced over ``axis``; and whether any was there."""
    b = ctx.b
    ident = b.full(shape=[], dtype=dtype_name(dtype), value=_identity(ctx, reduction, dtype))
    spread = b.select(mask, updates, ident)
    if dtype == np.bool_:
        if reduction == "mul" or reduction == "min":
            reduced = b.all(spread, axes=[axis])
        else:
            reduced = b.any(spread, axes=[axis])
    else:
        reduced = _reduce(ctx, reduction, spread, axis)
    return reduced, b.any(mask, axes=[axis])


@converter("ScatterElements")
def scatter_elements(ctx: Context) -> list:
    """``data`` with ``updates[i..]`` written (or reduced) at ``i..`` with
    ``indices[i..]`` on ``axis``. With ``reduction='none'`` and repeated
    indices, which update lands is unspecified (ONNX leaves it undefined)."""
    dims = list(ctx.shape(0))
    idims = list(ctx.shape(1))
    rank = len(dims)
    if len(idims) != rank:
        raise ctx.fail("data and indices must have the same rank")
    axis = _axis(ctx, ctx.attr("axis", 0), rank)
    reduction = ctx.choice("reduction", _REDUCTIONS, "none")
    b = ctx.b
    dtype = _index_dtype(ctx, 1)
    idx = ctx.input(1)
    if reduction in ("mul", "max", "min"):
        return [_scatter_elements_dense(ctx, dims, idims, axis, reduction)]
    coords = _iota_coords(ctx, idims, rank, dtype)
    coords[axis] = b.expand_dims(idx, axes=[rank])
    full = b.concatenate(*coords, axis=-1) if rank > 1 else coords[0]
    return [_scatter(ctx, ctx.input(0), full, ctx.input(2), list(range(rank)), reduction)]


def _scatter_elements_dense(ctx: Context, dims, idims, axis: int, reduction: str):
    """ScatterElements with mul/max/min, which MLX has no scatter for: a
    mask ``indices[..] == j`` over a new last axis ``j`` of the data's size
    on ``axis`` (memory: the indices' size times that axis), the updates
    reduced over ``axis`` under it, then combined with the data where any
    landed."""
    b = ctx.b
    rank = len(dims)
    d = dims[axis]
    if not _is_int(d):
        raise ctx.fail(f"reduction={reduction!r} needs a static size on axis {axis}")
    dtype = np.dtype(ctx.dtype(0))
    idx = b.astype(ctx.input(1), dtype="int64")
    idx = b.select(b.less(idx, ctx.scalar(0, idx)), b.add(idx, ctx.scalar(d, idx)), idx)
    positions = b.iota(shape=[*([1] * rank), d], dtype="int64", axis=rank)
    mask = b.equal(b.expand_dims(idx, axes=[rank]), positions)       # S + [d]
    updates = b.expand_dims(ctx.input(2), axes=[rank])
    reduced, hit = _dense_reduce(ctx, reduction, mask, updates, dtype, axis)
    # S without axis + [d] -> S with d on axis
    order = [*range(axis), rank - 1, *range(axis, rank - 1)]
    reduced = b.transpose(reduced, axes=order)
    hit = b.transpose(hit, axes=order)
    width = [[0, 0 if a == axis else _pad_to(ctx, dims[a], idims[a])] for a in range(rank)]
    if any(w[1] for w in width):
        reduced = b.pad(reduced, b.full(shape=[], dtype=dtype_name(dtype),
                                        value=_identity(ctx, reduction, dtype)),
                        pad_width=width)
        hit = b.pad(hit, b.constant(False, "bool"), pad_width=width)
    data = ctx.input(0)
    return b.select(hit, _combine(ctx, reduction, data, reduced, dtype), data)


def _pad_to(ctx: Context, d, i) -> int:
    if d == i:
        return 0
    if not (_is_int(d) and _is_int(i)):
        raise ctx.fail("indices smaller than the data on a symbolic axis are not supported")
    return d - i


@converter("ScatterND")
def scatter_nd(ctx: Context) -> list:
    """``data`` with ``updates`` written (or reduced) at the index vectors
    (the indices' last axis) into its leading axes."""
    dims = list(ctx.shape(0))
    k = ctx.shape(1)[-1]
    if not _is_int(k) or k > len(dims):
        raise ctx.fail(f"the index vector length {k} must be static and at most the rank")
    reduction = ctx.choice("reduction", _REDUCTIONS, "none")
    if k == 0:
        raise ctx.fail("empty index vectors are not supported")
    if reduction in ("mul", "max", "min"):
        return [_scatter_nd_dense(ctx, dims, list(ctx.shape(1)), k, reduction)]
    return [_scatter(ctx, ctx.input(0), ctx.input(1), ctx.input(2), list(range(k)),
                     reduction)]


def _scatter_nd_dense(ctx: Context, dims, idims, k: int, reduction: str):
    """ScatterND with mul/max/min: each index vector as a row-major offset
    into the data's first ``k`` axes, a mask against every offset (memory:
    the number of index vectors times the data's size), the updates reduced
    under it and combined with the data where any landed."""
    b = ctx.b
    if not all(_is_int(d) for d in dims) or not all(_is_int(d) for d in idims):
        raise ctx.fail(f"reduction={reduction!r} needs static shapes")
    dtype = np.dtype(ctx.dtype(0))
    n, cells = prod(idims[:-1]), prod(dims[:k])
    rest = dims[k:]
    idx = b.reshape(b.astype(ctx.input(1), dtype="int64"), shape=[n, k])
    sizes = b.constant([int(d) for d in dims[:k]], "int64")
    idx = b.select(b.less(idx, ctx.scalar(0, idx)), b.add(idx, sizes), idx)
    strides = [int(prod(dims[j + 1:k])) for j in range(k)]
    offset = b.sum(b.multiply(idx, b.constant(strides, "int64")), axes=[1])   # [n]
    positions = b.iota(shape=[1, cells], dtype="int64", axis=1)
    mask = b.equal(b.expand_dims(offset, axes=[1]), positions)                 # [n, cells]
    mask = b.reshape(mask, shape=[n, cells, *([1] * len(rest))])
    updates = b.reshape(ctx.input(2), shape=[n, 1, *rest])
    reduced, hit = _dense_reduce(ctx, reduction, mask, updates, dtype, 0)  # [cells, *rest]
    reduced = b.reshape(reduced, shape=dims)
    hit = b.reshape(hit, shape=[*dims[:k], *([1] * len(rest))])
    data = ctx.input(0)
    return b.select(hit, _combine(ctx, reduction, data, reduced, dtype), data)


@converter("TopK")
def top_k(ctx: Context) -> list:
    """The ``k`` largest (``largest=1``) or smallest elements along ``axis``,
    sorted (also when ``sorted=0``, which leaves the order open), and their
    int64 indices; equal elements keep their original order (a stable sort,
    as the reference)."""
    dims = list(ctx.shape(0))
    axis = _axis(ctx, ctx.attr("axis", -1), len(dims))
    k = ctx.static(1, "K")
    if len(k) != 1:
        raise ctx.fail(f"K must hold one value (it holds {len(k)})")
    k = k[0]
    if _is_int(dims[axis]) and not 0 <= k <= dims[axis]:
        raise ctx.fail(f"K={k} is out of range for axis size {dims[axis]}")
    largest = bool(ctx.attr("largest", 1))
    b = ctx.b
    x = ctx.input(0)
    order = b.argsort(x, axis=axis, descending=largest)
    lengths = list(dims)
    lengths[axis] = k
    order = b.slice(order, lengths=lengths)
    values = b.take_along_axis(x, order, axis=axis)
    return [values, b.astype(order, dtype="int64")]


# -- ReverseSequence, TensorScatter --------------------------------------------------------


def _along(b, size, axis: int, rank: int, dtype: str = "int64"):
    """``0 .. size-1`` laid along ``axis`` of a rank-``rank`` array of ones."""
    shape = [1] * rank
    shape[axis] = size
    return b.iota(shape=shape, dtype=dtype, axis=axis)


@converter("ReverseSequence")
def reverse_sequence(ctx: Context) -> list:
    """Each batch entry (along ``batch_axis``, default 1) with its first
    ``sequence_lens[i]`` steps along ``time_axis`` (default 0) reversed, the
    rest as they are."""
    shape = list(ctx.shape(0))
    rank = len(shape)
    time_axis, batch_axis = ctx.attr("time_axis", 0), ctx.attr("batch_axis", 1)
    if rank < 2 or sorted((time_axis, batch_axis)) != [0, 1]:
        raise ctx.fail(f"attributes time_axis={time_axis} and batch_axis={batch_axis} must "
                       "be 0 and 1 (either order) of an input of rank 2 or more")
    b = ctx.b
    lens = b.astype(ctx.input(1), dtype="int64")
    lens = b.reshape(lens, shape=[shape[batch_axis] if a == batch_axis else 1
                                  for a in range(rank)])
    t = _along(b, shape[time_axis], time_axis, rank)
    reversed_t = b.subtract(b.subtract(lens, b.constant(1, "int64")), t)
    index = b.select(b.less(t, lens), reversed_t, t)
    index = b.broadcast_to(index, shape=shape)
    return [b.take_along_axis(ctx.input(0), index, axis=time_axis)]


@converter("TensorScatter")
def tensor_scatter(ctx: Context) -> list:
    """``past_cache`` with ``update`` written along ``axis`` (default -2, not
    the batch axis 0) from ``write_indices[b]`` (default 0) per batch entry;
    ``mode="circular"`` wraps past the cache's end, ``"linear"`` (default)
    must not reach it."""
    mode = ctx.choice("mode", ("linear", "circular"), "linear")
    cache, update = list(ctx.shape(0)), list(ctx.shape(1))
    rank = len(cache)
    axis = _axis(ctx, ctx.attr("axis", -2), rank)
    if axis == 0:
        raise ctx.fail("attribute axis=0 is the batch axis; the sequence axis must be another")
    if len(update) != rank or any(c != u for a, (c, u) in enumerate(zip(cache, update))
                                  if a != axis):
        raise ctx.fail(f"update {update} must match past_cache {cache} but along axis {axis}")
    b = ctx.b
    total, length = cache[axis], update[axis]
    # For each cache slot j: the update step s = j - start (mod total,
    # circular) written there, where 0 <= s < length.
    slot = _along(b, total, axis, rank)
    if ctx.has_input(2):
        start = b.astype(ctx.input(2), dtype="int64")
        start = b.reshape(start, shape=[cache[0]] + [1] * (rank - 1))
        step = b.subtract(slot, start)
    else:
        step = slot
    if mode == "circular":
        # mlxprog's remainder truncates: shift the step (> -total, for a
        # write index within the cache) to non-negative first.
        step = b.remainder(b.add(step, b.constant(total, "int64")), b.constant(total, "int64"))
    written = b.logical_and(b.greater_equal(step, b.constant(0, "int64")),
                            b.less(step, b.constant(length, "int64")))
    step = b.clip(step, b.constant(0, "int64"), b.constant(max(length - 1, 0), "int64"))
    index = b.broadcast_to(step, shape=[*cache[:axis], total, *cache[axis + 1:]])
    values = b.take_along_axis(ctx.input(1), index, axis=axis)
    return [b.select(written, values, ctx.input(0))]
