"""Reductions: ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1
ReduceL2 ReduceLogSum ReduceLogSumExp ReduceSumSquare, ArgMax ArgMin, and
the scan CumSum.

``axes`` is an attribute before opset 18 (13 for ReduceSum) and an optional
input since, which must be known at import. No axes reduce every axis, or,
with ``noop_with_empty_axes=1``, none (the op's elementwise parts, ``x * x``
of ReduceSumSquare say, still apply, as in the reference). ``keepdims``
defaults to 1. Results keep the input's element type (integer means are
truncated, as the reference's). A zero-size input gives the reduction's
value over no elements, as the reference: 0 (Sum, L1, L2, SumSquare), 1
(Prod), -inf or the type's minimum (Max, LogSum, LogSumExp), +inf or its
maximum (Min), NaN (Mean of floats).
"""

from __future__ import annotations

import numpy as np

from ...arrays import name_of
from .. import shape_rules
from ..context import Context
from ..registry import converter, register_made
from .elementwise import cast, is_float, same_dtype, trunc_divide

_SINCE_AXES_INPUT = 18


def _axes(ctx: Context, rank: int) -> list[int] | None:
    """The reduced axes, normalised (None: all)."""
    since = 13 if ctx.node.op_type == "ReduceSum" else _SINCE_AXES_INPUT
    if ctx.opset >= since:
        axes = ctx.static(1, "axes") if ctx.has_input(1) else None
    else:
        axes = ctx.attr("axes", None)
    if not axes:
        return [] if ctx.attr("noop_with_empty_axes", 0) else None
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise ctx.fail(f"axis {a} is out of range for rank {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise ctx.fail(f"axes {axes} repeat an axis")
    return sorted(out)


def _empty_value(ctx: Context, x, axes, keepdims: bool, value) -> object | None:
    """Where ``x`` is statically empty, the reduction's result as a constant
    ``full`` of ``value`` (a number, ``"inf"``/``"-inf"``/``"nan"``), else None."""
    shape = ctx.shape(0)
    if not any(d == 0 for d in shape):
        return None
    reduced = range(len(shape)) if axes is None else axes
    out = [1 if i in reduced else d for i, d in enumerate(shape)] if keepdims else \
        [d for i, d in enumerate(shape) if i not in reduced]
    return ctx.b.full(shape=out, dtype=name_of(x.dtype), value=value)


def _extreme(x, largest: bool):
    """The dtype's largest (or smallest) value, as a ``full`` value."""
    dtype = np.dtype(name_of(x.dtype).replace("bool", "bool_"))
    if dtype == np.bool_:
        return largest
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return int(info.max if largest else info.min)
    return "inf" if largest else "-inf"


def _count(ctx: Context, x, axes):
    """The number of elements reduced into each result, as a scalar of ``x``'s type."""
    shape = ctx.shape(0)
    sizes = [shape[a] for a in (range(len(shape)) if axes is None else axes)]
    if all(isinstance(s, int) for s in sizes):
        return ctx.scalar(int(np.prod(sizes, dtype=np.int64)), x)
    ones = ctx.b.add(ctx.b.multiply(x, ctx.scalar(0, x)), ctx.scalar(1, x))
    return ctx.b.sum(ones, axes=axes, keepdims=True)


def _reduction(kind: str, empty):
    """The converter of a reduction: ``REDUCERS[kind]``, or a constant of
    ``empty`` (a value, or a function of the input giving one) for a
    statically empty input."""

    def convert(ctx: Context) -> list:
        x = ctx.input(0)
        axes = _axes(ctx, x.ndim)
        keepdims = bool(ctx.choice("keepdims", (0, 1), 1))
        if axes == []:
            keepdims = True  # nothing is reduced: no axis to drop
        if empty is not None:
            value = empty(x) if callable(empty) else empty
            found = _empty_value(ctx, x, axes, keepdims, value)
            if found is not None:
                return [found]
        return [same_dtype(ctx, REDUCERS[kind](ctx, x, axes, keepdims), x)]

    return convert


def _sum(ctx, x, axes, keepdims):
    return ctx.b.sum(x, axes=axes, keepdims=keepdims)


def _max(ctx, x, axes, keepdims):
    return ctx.b.reduce_max(x, axes=axes, keepdims=keepdims) if axes != [] else x


def _min(ctx, x, axes, keepdims):
    return ctx.b.reduce_min(x, axes=axes, keepdims=keepdims) if axes != [] else x


def _mean(ctx, x, axes, keepdims):
    if axes == []:
        return x
    if is_float(x):
        return ctx.b.mean(x, axes=axes, keepdims=keepdims)
    total = same_dtype(ctx, _sum(ctx, x, axes, True), x)
    result = trunc_divide(ctx, total, _count(ctx, x, axes))
    if not keepdims:
        result = ctx.b.squeeze(result, axes=list(range(x.ndim)) if axes is None else axes)
    return result


def _prod(ctx, x, axes, keepdims):
    return ctx.b.product(x, axes=axes, keepdims=keepdims)


def _l1(ctx, x, axes, keepdims):
    return _sum(ctx, ctx.b.abs(x), axes, keepdims)


def _sum_square(ctx, x, axes, keepdims):
    return _sum(ctx, ctx.b.multiply(x, x), axes, keepdims)


def _l2(ctx, x, axes, keepdims):
    squares = same_dtype(ctx, _sum_square(ctx, x, axes, keepdims), x)
    if not is_float(x):
        squares = cast(ctx, squares, "float64" if x.dtype.size == 8 else "float32")
    return ctx.b.sqrt(squares)


def _log_sum(ctx, x, axes, keepdims):
    return ctx.b.log(_sum(ctx, x, axes, keepdims))


def _log_sum_exp(ctx, x, axes, keepdims):
    """``log(sum(exp(x - m))) + m`` with ``m`` the maximum (0 where infinite)."""
    b = ctx.b
    m = _max(ctx, x, axes, True)
    m = b.select(b.is_infinity(m), ctx.scalar(0, m), m)
    y = b.add(b.log(b.sum(b.exp(b.subtract(x, m)), axes=axes, keepdims=True)), m)
    if not keepdims and axes != []:
        y = b.squeeze(y, axes=list(range(x.ndim)) if axes is None else axes)
    return y


REDUCERS = {
    "sum": _sum, "mean": _mean, "max": _max, "min": _min, "prod": _prod, "l1": _l1,
    "l2": _l2, "sum_square": _sum_square, "log_sum": _log_sum, "log_sum_exp": _log_sum_exp,
}

def _register(onnx_op: str, kind: str, empty, doc: str, **traits) -> None:
    register_made(onnx_op, _reduction(kind, empty), f"{doc} over ``axes`` (see the module's notes).",
                  **traits)


_register("ReduceSum", "sum", None, "Sum")
_register("ReduceMean", "mean", None, "Arithmetic mean (integers: truncated)")
_register("ReduceMax", "max", lambda x: _extreme(x, False), "Maximum (NaN propagates)")
_register("ReduceMin", "min", lambda x: _extreme(x, True), "Minimum (NaN propagates)")
_register("ReduceProd", "prod", None, "Product", shape_rule=shape_rules.REDUCE_PROD)
_register("ReduceL1", "l1", None, "Sum of absolute values")
_register("ReduceL2", "l2", None, "Square root of the sum of squares")
_register("ReduceSumSquare", "sum_square", None, "Sum of squares")
_register("ReduceLogSum", "log_sum", "-inf", "Logarithm of the sum")
_register("ReduceLogSumExp", "log_sum_exp", "-inf", "``log(sum(exp(x)))``, computed stably")


# -- arg reductions ----------------------------------------------------------------------------


def _arg(op: str):
    def convert(ctx: Context) -> list:
        x = ctx.input(0)
        b = ctx.b
        rank = x.ndim
        axis = ctx.attr("axis", 0)
        if not -max(rank, 1) <= axis < max(rank, 1):
            raise ctx.fail(f"axis {axis} is out of range for rank {rank}")
        axis = axis % rank if rank else None
        keepdims = bool(ctx.choice("keepdims", (0, 1), 1))
        last = ctx.choice("select_last_index", (0, 1), 0)
        if axis is None:  # a scalar: index 0
            return [b.constant(0, "int64")]
        if last:
            # The first extreme of x reversed along the axis, j, is the last of x: n-1-j.
            n = ctx.shape(0)[axis]
            if isinstance(n, int):
                last_index = b.constant(n - 1, "int64")
            else:  # a symbolic size: counted at run time (not x < x is true even for NaN)
                ones = cast(ctx, b.logical_not(b.less(x, x)), "int64")
                count = b.sum(ones, axes=[axis], keepdims=keepdims)
                last_index = b.subtract(count, b.constant(1, "int64"))
            found = getattr(b, op)(b.reverse(x, axes=[axis]), axis=axis, keepdims=keepdims)
            return [b.subtract(last_index, cast(ctx, found, "int64"))]
        return [cast(ctx, getattr(b, op)(x, axis=axis, keepdims=keepdims), "int64")]
    return convert


argmax = converter("ArgMax")(_arg("argmax"))
argmax.__doc__ = ("Index (int64) of the first maximum along ``axis`` (default 0); "
                  "``select_last_index=1``: the last; ``keepdims`` default 1.")
argmin = converter("ArgMin")(_arg("argmin"))
argmin.__doc__ = ("Index (int64) of the first minimum along ``axis`` (default 0); "
                  "``select_last_index=1``: the last; ``keepdims`` default 1.")


def _cumulative(ctx: Context, op: str) -> list:
    """A running ``op`` (``cumulative_sum``/``cumulative_product``) along
    ``axis`` (input 1, a scalar known at import); ``exclusive=1`` leaves each
    position's own element out, ``reverse=1`` runs from the end. The input's
    element type."""
    x = ctx.input(0)
    (axis,) = ctx.static(1, "axis")
    if not -x.ndim <= axis < x.ndim:
        raise ctx.fail(f"axis {axis} is out of range for rank {x.ndim}")
    y = getattr(ctx.b, op)(x, axis=axis % x.ndim,
                           reverse=bool(ctx.choice("reverse", (0, 1), 0)),
                           inclusive=not ctx.choice("exclusive", (0, 1), 0))
    return [same_dtype(ctx, y, x)]


@converter("CumSum")
def cum_sum(ctx: Context) -> list:
    """Running sum (see :func:`_cumulative`)."""
    return _cumulative(ctx, "cumulative_sum")


@converter("CumProd")
def cum_prod(ctx: Context) -> list:
    """Running product (see :func:`_cumulative`; exclusive: a leading 1)."""
    return _cumulative(ctx, "cumulative_product")
