"""Shape computations on symbolic dims, evaluated at import.

Models exported with dynamic dims (PyTorch's ``dynamic_axes``) compute
shapes at run time: ``Shape`` of an input, then ``Gather``, ``Concat``,
``Mul`` ... on the result, into a ``Reshape`` or an ``Expand``. mlxprog's
shape attributes take dim expressions (``"N*3"``), so the importer computes
all of that at import instead: a *shape value* is a NumPy object array whose
elements are ints and dim expressions (strings, as :func:`~mlxprog.symbolic.expr.fmt`
writes them), and :func:`fold` evaluates the ops of :data:`OPS` on such
arrays (ONNX's reference evaluator only takes numeric ones). A result made
only of ints becomes a numeric array again, so the reference evaluator takes
over from there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import onnx

from ..symbolic.expr import BinOp, Expr, fmt, parse, to_poly

if TYPE_CHECKING:
    from .context import Context

Dim = int | str

_ARITH = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "//"}


class Unknown(Exception):
    """The result is not known at import (an ``Equal`` of two different dims,
    a float that is not an integer ...): the node's converter runs instead."""


def dim(value) -> Dim:
    """One element of a shape value, normalised: an int, or a simplified
    expression (one that simplifies to a number is that int)."""
    if isinstance(value, str):
        poly = to_poly(parse(value))
        if poly is not None and set(poly) <= {()}:
            return poly.get((), 0)
        return fmt(parse(value))
    if isinstance(value, (bool, np.bool_)):
        raise Unknown
    if isinstance(value, (float, np.floating)):
        if not float(value).is_integer():
            raise Unknown
    return int(value)


def shape_value(sizes) -> np.ndarray:
    """A shape (ints and dim names) as an int64 array, or an object array
    where it holds symbolic dims."""
    sizes = [dim(s) for s in sizes]
    if all(isinstance(s, int) for s in sizes):
        return np.array(sizes, np.int64)
    return np.array(sizes, dtype=object)


def _expr(value: Dim) -> Expr:
    return parse(value) if isinstance(value, str) else value


def _arith(op: str, a, b) -> Dim:
    a, b = dim(a), dim(b)
    if isinstance(a, int) and isinstance(b, int):
        if op == "//":
            if b == 0:
                raise Unknown
            # ONNX's integer division truncates toward zero.
            q = abs(a) // abs(b)
            return q if (a >= 0) == (b >= 0) else -q
        return {"+": a + b, "-": a - b, "*": a * b}[op]
    return dim(fmt(BinOp(op, _expr(a), _expr(b))))


def _lower_bound(value: Dim, dims: dict) -> int | None:
    """A lower bound of a dim expression: a dim's declared minimum, or 1 for a
    polynomial with positive coefficients (every dim is at least 1)."""
    if isinstance(value, int):
        return value
    if value in dims:
        return dims[value].min
    poly = to_poly(parse(value))
    if poly is not None and all(c > 0 for c in poly.values()):
        return sum(poly.values())
    return None


def _equal(dims: dict) -> Callable:
    def equal(a, b) -> bool:
        a, b = dim(a), dim(b)
        if a == b:
            return True
        if isinstance(a, int) and isinstance(b, int):
            return False
        # A dim is never below its minimum: comparing one to a smaller
        # number (PyTorch's exports compare shapes with -1 and 0) is False.
        for sym, num in ((a, b), (b, a)):
            bound = _lower_bound(sym, dims)
            if isinstance(num, int) and bound is not None and num < bound:
                return False
        raise Unknown

    return equal


def _extreme(dims: dict, largest: bool) -> Callable:
    """``Max``/``Min`` of two dims, where the dims' minimums decide it (PyTorch
    exports clamp sizes with ``Max(size, 1)``)."""

    def pick(a, b) -> Dim:
        a, b = dim(a), dim(b)
        if isinstance(a, int) and isinstance(b, int):
            return max(a, b) if largest else min(a, b)
        if a == b:
            return a
        for sym, num in ((a, b), (b, a)):
            bound = _lower_bound(sym, dims)
            if isinstance(num, int) and bound is not None and bound >= num:
                return sym if largest else num
        raise Unknown

    return pick


def _objects(array: np.ndarray) -> np.ndarray:
    return np.asarray(array).astype(object)


def _axes(ctx: Context, i: int, rank: int) -> list[int] | None:
    if not ctx.has_input(i):
        return None
    return [int(a) % rank for a in ctx.static(i, "axes")]


def _gather(ctx: Context, x: np.ndarray) -> np.ndarray:
    indices = ctx.require_constant(1, "indices")
    return np.take(x, indices.astype(np.int64), axis=ctx.attr("axis", 0))


def _slice(ctx: Context, x: np.ndarray) -> np.ndarray:
    starts, ends = ctx.static(1, "starts"), ctx.static(2, "ends")
    axes = _axes(ctx, 3, x.ndim) or list(range(len(starts)))
    steps = ctx.static(4, "steps") if ctx.has_input(4) else [1] * len(starts)
    index = [slice(None)] * x.ndim
    for axis, start, end, step in zip(axes, starts, ends, steps):
        index[axis] = slice(start, end, step)
    return x[tuple(index)]


def _concat(ctx: Context, x: np.ndarray) -> np.ndarray:
    parts = [ctx.require_constant(i, "a part") for i in range(ctx.num_inputs)]
    return np.concatenate([_objects(p) for p in parts], axis=ctx.attr("axis"))


def _unsqueeze(ctx: Context, x: np.ndarray) -> np.ndarray:
    rank = x.ndim + len(ctx.static(1, "axes"))
    for axis in sorted(_axes(ctx, 1, rank)):
        x = np.expand_dims(x, axis)
    return x


def _squeeze(ctx: Context, x: np.ndarray) -> np.ndarray:
    axes = _axes(ctx, 1, x.ndim)
    return np.squeeze(x, axis=None if axes is None else tuple(axes))


def _cast(ctx: Context, x: np.ndarray) -> np.ndarray:
    if ctx.attr("to") == onnx.TensorProto.BOOL:
        raise Unknown
    return x


def _reshape(ctx: Context, x: np.ndarray) -> np.ndarray:
    shape = ctx.static(1, "shape")
    if not ctx.attr("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _expand(ctx: Context, x: np.ndarray) -> np.ndarray:
    shape = np.broadcast_shapes(x.shape, tuple(ctx.static(1, "shape")))
    return np.broadcast_to(x, shape).copy()


def _reduce_prod(ctx: Context, x: np.ndarray) -> np.ndarray:
    """The product of a shape value's elements (a flatten's size); only
    over every axis, as exporters use it."""
    if ctx.has_input(1) and sorted(a % x.ndim for a in ctx.static(1, "axes")) != list(
            range(x.ndim)):
        raise Unknown
    total: Dim = 1
    for v in x.reshape(-1):
        total = _arith("*", total, v)
    shape = (1,) * x.ndim if ctx.attr("keepdims", 1) else ()
    return np.array(total, dtype=object).reshape(shape)


def _elementwise(fn: Callable, nin: int = 2) -> Callable:
    ufunc = np.frompyfunc(fn, nin, 1)

    def apply(ctx: Context, x: np.ndarray) -> np.ndarray:
        operands = [_objects(ctx.require_constant(i, "an operand")) for i in range(nin)]
        return np.asarray(ufunc(*operands), dtype=object)

    return apply


def _variadic(fn: Callable) -> Callable:
    """``fn`` of two elements over all of a node's inputs (``Max``, ``Min``), broadcast."""
    ufunc = np.frompyfunc(fn, 2, 1)

    def apply(ctx: Context, x: np.ndarray) -> np.ndarray:
        result = x
        for i in range(1, ctx.num_inputs):
            result = ufunc(result, _objects(ctx.require_constant(i, "an operand")))
        return np.asarray(result, dtype=object)

    return apply


def _neg(ctx: Context, x: np.ndarray) -> np.ndarray:
    return np.asarray(np.frompyfunc(lambda v: _arith("-", 0, v), 1, 1)(x), dtype=object)


def _where(ctx: Context, x: np.ndarray) -> np.ndarray:
    condition = ctx.require_constant(0, "condition")
    if condition.dtype == object:
        raise Unknown
    x, y = (_objects(ctx.require_constant(i, "an operand")) for i in (1, 2))
    return np.where(condition, x, y)


def _op_table(dims: dict) -> dict[str, Callable]:
    table = {"Gather": _gather, "Slice": _slice, "Concat": _concat,
             "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Cast": _cast,
             "Reshape": _reshape, "Expand": _expand, "Identity": lambda ctx, x: x,
             "Where": _where, "Equal": _elementwise(_equal(dims)), "ReduceProd": _reduce_prod,
             # Shape values hold integers: rounding keeps them.
             "Floor": lambda ctx, x: x, "Ceil": lambda ctx, x: x,
             "Neg": _neg, "Max": _variadic(_extreme(dims, True)),
             "Min": _variadic(_extreme(dims, False))}
    for op_type, op in _ARITH.items():
        table[op_type] = _elementwise(lambda a, b, op=op: _arith(op, a, b))
    integer_div = table["Div"]
    table["Div"] = lambda ctx, x: (_elementwise(_exact_div)(ctx, x)
                                   if np.issubdtype(ctx.dtype(0), np.floating)
                                   else integer_div(ctx, x))
    return table


def _exact_div(a, b) -> Dim:
    """A float ``Div`` of shape values (after a ``Cast``): known only where it
    is exact (``6*N / 3``); ``N / 2`` is a fraction that a later ``Floor`` or
    ``Ceil`` would round its own way."""
    a, b = dim(a), dim(b)
    if isinstance(a, int) and isinstance(b, int):
        if b == 0 or a % b:
            raise Unknown
        return a // b
    result = _arith("//", a, b)
    if isinstance(result, str) and "//" in result:
        raise Unknown
    return result


#: The ops evaluated on shape values (object arrays).
OPS = frozenset(_op_table({})) | {"Shape", "Size"}


def fold(ctx: Context, dims: dict) -> list[np.ndarray] | None:
    """The node's outputs computed at import from shape values (or, for
    ``Shape``/``Size``, from its input's shape), or None when they are not
    known at import (the converter runs)."""
    op_type = ctx.node.op_type
    try:
        if op_type == "Shape":
            sizes = ctx.shape(0)
            start, end = ctx.attr("start", 0), ctx.attr("end", None)
            result = shape_value(sizes[start:end])
        elif op_type == "Size":
            total: Dim = 1
            for size in ctx.shape(0):
                total = _arith("*", total, size)
            result = np.array(total, dtype=object)
        else:
            data = 0 if op_type != "Where" else 1
            x = _objects(ctx.require_constant(data, "the data"))
            result = _op_table(dims)[op_type](ctx, x)
    except Unknown:
        return None
    if not isinstance(result, np.ndarray):  # NumPy indexing to one element gives it bare
        result = np.array(result, dtype=object)
    return [numeric(result, ctx)]


def numeric(result: np.ndarray, ctx: Context) -> np.ndarray:
    """A folded shape value: normalised elements, as an int64 array (the
    ``to`` type of a ``Cast``, bool for ``Equal``) where none is symbolic."""
    if result.dtype != object:
        return result
    if ctx.node.op_type == "Equal":
        return result.astype(np.bool_)
    flat = [dim(v) for v in result.reshape(-1)]
    if any(isinstance(v, str) for v in flat):
        return np.array(flat, dtype=object).reshape(result.shape)
    dtype = np.int64
    if ctx.node.op_type == "Cast":
        dtype = onnx.helper.tensor_dtype_to_np_dtype(ctx.attr("to"))
    return np.array(flat, dtype=dtype).reshape(result.shape)


def result_dtype(ctx: Context) -> np.dtype:
    """The ONNX element type of the node's shape-value result: a ``Cast``'s
    target, int64 for ``Shape``/``Size``, else its first data input's."""
    op_type = ctx.node.op_type
    if op_type == "Cast":
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(ctx.attr("to")))
    if op_type in ("Shape", "Size"):
        return np.dtype(np.int64)
    return ctx.dtype(_data_inputs(ctx)[0])


def _data_inputs(ctx: Context) -> list[int]:
    """The inputs an op of :data:`OPS` computes its result from (the others,
    such as ``Gather``'s indices, only say how)."""
    op_type = ctx.node.op_type
    if op_type in ("Concat", "Equal", "Max", "Min", *_ARITH):
        return list(range(ctx.num_inputs))
    return [1, 2] if op_type == "Where" else [0]


def applies(ctx: Context) -> bool:
    """Whether :func:`fold` is the node's evaluation: an op of :data:`OPS`
    whose data inputs are all known at import, a shape value among them, or
    ``Shape``/``Size`` of a value that is not known at import (its shape is)."""
    op_type = ctx.node.op_type
    if op_type not in OPS:
        return False
    data = [ctx.constant(i) for i in _data_inputs(ctx)]
    if op_type in ("Shape", "Size"):
        return data[0] is None or data[0].dtype == object
    return (all(d is not None for d in data)
            and any(d.dtype == object for d in data))
