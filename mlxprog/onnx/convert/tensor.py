"""Types and tensor creation: Cast, CastLike, BitCast, ConstantOfShape, Range,
EyeLike, Trilu, Where, OneHot.

Nodes whose inputs are all known at import are folded by the importer; the
converters here run on run-time inputs, or on shapes holding symbolic dims.
"""

from __future__ import annotations

import numpy as np

from .. import shape_rules
from ..context import Context
from ..dtypes import dtype_name, is_float_dtype, numpy_dtype
from ..registry import converter
from .shape import _axis, _dims, _is_int, _sub, _symbolic


def _onnx_dtype(ctx: Context, to: int) -> np.dtype:
    return numpy_dtype(to, ctx.where)


def _cast(ctx: Context, to: np.dtype) -> list:
    data = ctx.constant(0)
    if _symbolic(data):
        if np.issubdtype(to, np.integer):
            return [data]
        raise ctx.fail(f"cannot cast a shape holding symbolic dims to {to}")
    x = ctx.input(0)
    if np.dtype(ctx.dtype(0)) == to:
        return [x]
    return [ctx.b.astype(x, dtype=dtype_name(to))]


@converter("Cast", shape_rule=shape_rules.CAST)
def cast(ctx: Context) -> list:
    """Convert to ``to`` (floats truncate toward zero into integers)."""
    return _cast(ctx, _onnx_dtype(ctx, ctx.attr("to")))


@converter("CastLike")
def cast_like(ctx: Context) -> list:
    """Convert to input 1's element type."""
    return _cast(ctx, np.dtype(ctx.dtype(1)))


@converter("BitCast")
def bit_cast(ctx: Context) -> list:
    """The input's bits read as type ``to``, which must have the same width
    (the shape is kept)."""
    to = _onnx_dtype(ctx, ctx.attr("to"))
    source = np.dtype(ctx.dtype(0))
    if to.itemsize != source.itemsize:
        raise ctx.fail(f"attribute to={dtype_name(to)} must have the width of the input's "
                       f"type {dtype_name(source)}")
    if to == source:
        return [ctx.input(0)]
    return [ctx.b.bitcast(ctx.input(0), dtype=dtype_name(to))]


def _fill_value(value, dtype: np.dtype):
    v = np.asarray(value).reshape(-1)[0].item()
    if isinstance(v, float):
        if np.isnan(v):
            return "nan"
        if np.isinf(v):
            return "inf" if v > 0 else "-inf"
    return v


@converter("ConstantOfShape")
def constant_of_shape(ctx: Context) -> list:
    """An array of the shape input, every element ``value`` (default float32 0)."""
    dims = _dims(ctx.require_constant(0, "shape"))
    value = ctx.attr("value", None)
    if value is None:
        value = np.zeros(1, np.float32)
    dtype = np.asarray(value).dtype
    fill = _fill_value(value, dtype)
    if dtype == np.bool_:
        fill = bool(fill)
    return [ctx.b.full(shape=dims, dtype=dtype_name(dtype), value=fill)]


@converter("Range")
def range_(ctx: Context) -> list:
    """``start, start + delta, ...`` below ``limit``; the inputs must be known
    at import (the length decides the shape); a symbolic limit with a
    static start and a step of 1 gives a symbolic length."""
    start, limit, delta = (ctx.require_constant(i, name)
                           for i, name in enumerate(("start", "limit", "delta")))
    dtype = next((np.dtype(ctx.dtype(i)) for i in range(3) if not _symbolic(ctx.constant(i))),
                 np.dtype(np.int64))
    s, l, d = (np.asarray(v).reshape(-1)[0] for v in (start, limit, delta))
    if not all(isinstance(v, (int, float, np.integer, np.floating)) and float(v).is_integer()
               for v in (s, d)):
        raise ctx.fail("only a symbolic limit with integral start and delta is supported "
                       "(all-constant Ranges are folded at import)")
    s, d = int(s), int(d)
    if d <= 0:
        raise ctx.fail("a symbolic limit needs a positive delta")
    n = _sub(l, s) if d == 1 else f"({_sub(l, s)}+{d - 1})//{d}"
    values = ctx.b.iota(shape=[n], dtype=dtype_name(dtype))
    if d != 1:
        values = ctx.b.multiply(values, ctx.scalar(d, values))
    if s:
        values = ctx.b.add(values, ctx.scalar(s, values))
    return [values]


@converter("EyeLike")
def eye_like(ctx: Context) -> list:
    """A matrix of the input's shape, ones on diagonal ``k``."""
    dims = list(ctx.shape(0))
    if len(dims) != 2:
        raise ctx.fail(f"the input must be 2-D (it is {len(dims)}-D)")
    if not _is_int(dims[0]):
        raise ctx.fail(f"the row count must be static (it is {dims[0]})")
    to = ctx.attr("dtype", None)
    dtype = _onnx_dtype(ctx, to) if to is not None else np.dtype(ctx.dtype(0))
    return [ctx.b.eye(n=dims[0], m=dims[1], k=ctx.attr("k", 0), dtype=dtype_name(dtype))]


@converter("Trilu")
def trilu(ctx: Context) -> list:
    """The upper (``upper=1``) or lower triangle of the last two axes from
    diagonal ``k`` (the optional k input), zeros elsewhere."""
    dims = list(ctx.shape(0))
    if len(dims) < 2:
        raise ctx.fail("the input must have rank 2 or more")
    k = ctx.static(1, "k")[0] if ctx.has_input(1) else 0
    upper = ctx.attr("upper", 1)
    b = ctx.b
    x = ctx.input(0)
    n, m = dims[-2], dims[-1]
    rows = b.iota(shape=[n, m], dtype="int32", axis=0)
    cols = b.iota(shape=[n, m], dtype="int32", axis=1)
    diff = b.subtract(cols, rows)
    kk = b.constant(int(k), "int32")
    mask = b.greater_equal(diff, kk) if upper else b.less_equal(diff, kk)
    return [b.select(mask, x, ctx.scalar(0, x))]


@converter("Where", shape_rule=shape_rules.WHERE)
def where(ctx: Context) -> list:
    """``condition ? x : y``, broadcasting."""
    return [ctx.b.select(ctx.input(0), ctx.input(1), ctx.input(2))]


# -- OneHot ----------------------------------------------------------------------------------


@converter("OneHot")
def one_hot(ctx: Context) -> list:
    """``values[1]`` where the index (negative: from the end) matches the
    position along the new ``axis`` of size ``depth``, ``values[0]`` elsewhere."""
    depth = np.asarray(ctx.require_constant(1, "depth")).reshape(-1)[0]
    depth = int(depth)
    rank = len(ctx.shape(0)) + 1
    axis = _axis(ctx, ctx.attr("axis", -1), rank)
    b = ctx.b
    idx = ctx.input(0)
    if is_float_dtype(ctx.dtype(0)):
        idx = b.astype(idx, dtype="int64")
    elif ctx.dtype(0) != np.int64:
        idx = b.astype(idx, dtype="int64")
    idx = b.select(b.less(idx, ctx.scalar(0, idx)), b.add(idx, ctx.scalar(depth, idx)), idx)
    idx = b.expand_dims(idx, axes=[axis])
    pos_shape = [1] * rank
    pos_shape[axis] = depth
    positions = b.iota(shape=pos_shape, dtype="int64", axis=axis)
    mask = b.equal(idx, positions)
    values = ctx.input(2)
    values = b.reshape(values, shape=[2])
    off = b.reshape(b.slice(values, lengths=[1], starts=[0]), shape=[])
    on = b.reshape(b.slice(values, lengths=[1], starts=[1]), shape=[])
    return [b.select(mask, on, off)]
