"""Shape values: shapes holding symbolic dims, as the importer computes them.

Models exported with dynamic dims (PyTorch's ``dynamic_axes``) compute
shapes at run time: ``Shape`` of an input, then ``Gather``, ``Concat``,
``Mul`` ... on the result, into a ``Reshape`` or an ``Expand``. mlxprog's
shape attributes take dim expressions (``"N*3"``), so the importer computes
all of that at import instead: a *shape value* is a NumPy object array whose
elements are ints and dim expressions (strings, as :func:`~mlxprog.symbolic.expr.fmt`
writes them). This module holds the arithmetic on their elements; how each
op computes on shape values is declared with its converter
(:mod:`.shape_rules`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..format.program import DimSpec
from ..symbolic.expr import BinOp, Expr, fmt, parse, to_poly

Dim = int | str


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


def shape_value(sizes: Sequence) -> np.ndarray:
    """A shape (ints and dim names) as an int64 array, or an object array
    where it holds symbolic dims."""
    sizes = [dim(s) for s in sizes]
    if all(isinstance(s, int) for s in sizes):
        return np.array(sizes, np.int64)
    return np.array(sizes, dtype=object)


def size_value(sizes: Sequence) -> np.ndarray:
    """The element count of a shape (ints and dim names) as an int64
    scalar, or an object scalar where it is a dim expression."""
    total: Dim = 1
    for size in sizes:
        total = arith("*", total, size)
    return np.array(total, np.int64 if isinstance(total, int) else object)


def _expr(value: Dim) -> Expr:
    return parse(value) if isinstance(value, str) else value


def arith(op: str, a, b) -> Dim:
    """``a op b`` for ``op`` one of ``+ - * //`` (``//`` truncating toward
    zero, as ONNX's integer division does)."""
    a, b = dim(a), dim(b)
    if isinstance(a, int) and isinstance(b, int):
        if op == "//":
            if b == 0:
                raise Unknown
            q = abs(a) // abs(b)
            return q if (a >= 0) == (b >= 0) else -q
        return {"+": a + b, "-": a - b, "*": a * b}[op]
    return dim(fmt(BinOp(op, _expr(a), _expr(b))))


def exact_div(a, b) -> Dim:
    """A float ``Div`` of shape values (after a ``Cast``): known only where it
    is exact (``6*N / 3``); ``N / 2`` is a fraction that a later ``Floor`` or
    ``Ceil`` would round its own way."""
    a, b = dim(a), dim(b)
    if isinstance(a, int) and isinstance(b, int):
        if b == 0 or a % b:
            raise Unknown
        return a // b
    result = arith("//", a, b)
    if isinstance(result, str) and "//" in result:
        raise Unknown
    return result


def _lower_bound(value: Dim, dims: Mapping[str, DimSpec]) -> int | None:
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


def equal(a, b, dims: Mapping[str, DimSpec]) -> bool:
    """Whether two elements are equal, where the dims' minimums (``dims``)
    decide it; :class:`Unknown` where they do not."""
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


def extreme(a, b, dims: Mapping[str, DimSpec], largest: bool) -> Dim:
    """The larger (``largest``) or smaller of two elements, where the dims'
    minimums (``dims``) decide it (PyTorch exports clamp sizes with
    ``Max(size, 1)``); :class:`Unknown` where they do not."""
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
