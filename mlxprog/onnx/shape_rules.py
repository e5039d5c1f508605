"""How ops compute on shape values at import: :class:`ShapeRule`.

A converter that computes on shape values (:mod:`.symbolic`) declares its
rule with ``@converter(..., shape_rule=...)``. The importer applies the
rule (:func:`fold`) before the converter when the node's data inputs are
all known at import and a shape value is among them (ONNX's reference
evaluator only takes numeric arrays); a result made only of ints becomes a
numeric array again, so the reference evaluator takes over from there.
Where the result is not known at import (:class:`~.symbolic.Unknown`) the
converter runs instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx

from .symbolic import Unknown, arith, dim, equal, exact_div, extreme

if TYPE_CHECKING:
    from .context import Context


@dataclass(frozen=True)
class ShapeRule:
    """How an op computes on shape values: ``evaluate(ctx, x)`` gives the
    result from ``x``, the first data input as an object array (it reads
    any other input itself); ``data`` are the inputs the result is computed
    from (None: all of them; the others, such as ``Gather``'s indices, only
    say how); ``dtype(ctx)`` is the result's element type where the op
    decides it (a ``Cast``'s ``to``, bool for ``Equal``), else int64 for a
    numeric result and the first data input's type for a shape value."""

    evaluate: Callable[[Context, np.ndarray], np.ndarray]
    data: tuple[int, ...] | None = (0,)
    dtype: Callable[[Context], np.dtype] | None = None

    def data_inputs(self, ctx: Context) -> list[int]:
        """The indices of the node's data inputs."""
        return list(range(ctx.num_inputs)) if self.data is None else list(self.data)


def _objects(array: np.ndarray) -> np.ndarray:
    return np.asarray(array).astype(object)


def applies(ctx: Context, rule: ShapeRule) -> bool:
    """Whether :func:`fold` is the node's evaluation: its data inputs all
    known at import, a shape value among them."""
    data = [ctx.constant(i) for i in rule.data_inputs(ctx)]
    return all(d is not None for d in data) and any(d.dtype == object for d in data)


def fold(ctx: Context, rule: ShapeRule) -> list[np.ndarray] | None:
    """The node's outputs computed at import from shape values, or None
    when they are not known at import (the converter runs)."""
    try:
        x = _objects(ctx.require_constant(rule.data_inputs(ctx)[0], "the data"))
        result = rule.evaluate(ctx, x)
    except Unknown:
        return None
    if not isinstance(result, np.ndarray):  # NumPy indexing to one element gives it bare
        result = np.array(result, dtype=object)
    return [_numeric(result, ctx, rule)]


def _numeric(result: np.ndarray, ctx: Context, rule: ShapeRule) -> np.ndarray:
    """A folded shape value: normalised elements, as a numeric array (of
    the rule's type, int64 by default) where none is symbolic."""
    if result.dtype != object:
        return result
    dtype = np.dtype(np.int64) if rule.dtype is None else rule.dtype(ctx)
    if dtype == np.bool_:
        return result.astype(np.bool_)
    flat = [dim(v) for v in result.reshape(-1)]
    if any(isinstance(v, str) for v in flat):
        return np.array(flat, dtype=object).reshape(result.shape)
    return np.array(flat, dtype=dtype).reshape(result.shape)


def result_dtype(ctx: Context, rule: ShapeRule) -> np.dtype:
    """The ONNX element type of the node's shape-value result: the rule's,
    else its first data input's."""
    if rule.dtype is not None:
        return rule.dtype(ctx)
    return ctx.dtype(rule.data_inputs(ctx)[0])


# -- the rules -------------------------------------------------------------------------


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


def _cast_dtype(ctx: Context) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(ctx.attr("to")))


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
    total: int | str = 1
    for v in x.reshape(-1):
        total = arith("*", total, v)
    shape = (1,) * x.ndim if ctx.attr("keepdims", 1) else ()
    return np.array(total, dtype=object).reshape(shape)


def _elementwise(fn: Callable) -> Callable[[Context, np.ndarray], np.ndarray]:
    """``fn(a, b, dims)`` of the elements of a node's two inputs, broadcast."""

    def apply(ctx: Context, x: np.ndarray) -> np.ndarray:
        ufunc = np.frompyfunc(lambda a, b: fn(a, b, ctx.dims), 2, 1)
        operands = [_objects(ctx.require_constant(i, "an operand")) for i in range(2)]
        return np.asarray(ufunc(*operands), dtype=object)

    return apply


def _variadic(fn: Callable) -> Callable[[Context, np.ndarray], np.ndarray]:
    """``fn(a, b, dims)`` of two elements over all of a node's inputs
    (``Max``, ``Min``), broadcast."""

    def apply(ctx: Context, x: np.ndarray) -> np.ndarray:
        ufunc = np.frompyfunc(lambda a, b: fn(a, b, ctx.dims), 2, 1)
        result = x
        for i in range(1, ctx.num_inputs):
            result = ufunc(result, _objects(ctx.require_constant(i, "an operand")))
        return np.asarray(result, dtype=object)

    return apply


def _arithmetic(op: str) -> ShapeRule:
    return ShapeRule(_elementwise(lambda a, b, dims: arith(op, a, b)), data=None)


def _div(ctx: Context, x: np.ndarray) -> np.ndarray:
    exact = np.issubdtype(ctx.dtype(0), np.floating)
    return _elementwise(lambda a, b, dims: exact_div(a, b) if exact else arith("//", a, b))(
        ctx, x)


def _neg(ctx: Context, x: np.ndarray) -> np.ndarray:
    return np.asarray(np.frompyfunc(lambda v: arith("-", 0, v), 1, 1)(x), dtype=object)


def _where(ctx: Context, x: np.ndarray) -> np.ndarray:
    condition = ctx.require_constant(0, "condition")
    if condition.dtype == object:
        raise Unknown
    x, y = (_objects(ctx.require_constant(i, "an operand")) for i in (1, 2))
    return np.where(condition, x, y)


GATHER = ShapeRule(_gather)
SLICE = ShapeRule(_slice)
CONCAT = ShapeRule(_concat, data=None)
UNSQUEEZE = ShapeRule(_unsqueeze)
SQUEEZE = ShapeRule(_squeeze)
CAST = ShapeRule(_cast, dtype=_cast_dtype)
RESHAPE = ShapeRule(_reshape)
EXPAND = ShapeRule(_expand)
#: Identity, and the rounding ops: shape values hold integers, which rounding keeps.
UNCHANGED = ShapeRule(lambda ctx, x: x)
WHERE = ShapeRule(_where, data=(1, 2))
EQUAL = ShapeRule(_elementwise(equal), data=None, dtype=lambda ctx: np.dtype(np.bool_))
REDUCE_PROD = ShapeRule(_reduce_prod)
ADD = _arithmetic("+")
SUB = _arithmetic("-")
MUL = _arithmetic("*")
#: An integer ``Div`` is ``//``; a float one (after a ``Cast``) only where it is exact.
DIV = ShapeRule(_div, data=None)
NEG = ShapeRule(_neg)
MAX = ShapeRule(_variadic(lambda a, b, dims: extreme(a, b, dims, True)), data=None)
MIN = ShapeRule(_variadic(lambda a, b, dims: extreme(a, b, dims, False)), data=None)
