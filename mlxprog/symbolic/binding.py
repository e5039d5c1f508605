"""Binding dims from call-time input shapes, and bucket padding.

At call time a symbolic program's dims are bound from the actual input shapes
(:func:`bind_dims`). With buckets, a dim's value is rounded up to a bucket size
(:func:`bucket`), the inputs are zero-padded to it (:func:`pad`) and the
outputs cut back to their true sizes (:func:`unpad`), so many lengths share a
few traces.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import mlx.core as mx

from ..errors import BindingError
from ..format.program import DimSpec
from .expr import Expr, evaluate, fmt, names


def bind_dims(shapes: list[tuple[str, list[Expr], tuple[int, ...]]],
              dims: Mapping[str, DimSpec]) -> dict[str, int]:
    """Bind dims from actual shapes. ``shapes`` lists ``(input name, declared
    shape, actual shape)``. Plain names bind first, then expressions with one
    unknown are solved; every axis is checked. Raises :class:`BindingError`
    naming the input, the axis and the dim."""
    bindings: dict[str, int] = {}
    origin: dict[str, str] = {}
    pending: list[tuple[str, int, Expr, int]] = []
    for name, declared, actual in shapes:
        if len(declared) != len(actual):
            raise BindingError(
                f"input {name!r} expects rank {len(declared)} "
                f"({_shape_text(declared)}), got shape {list(actual)}"
            )
        for axis, (expr, size) in enumerate(zip(declared, actual)):
            pending.append((name, axis, expr, size))

    def bind(dim: str, value: int, where: str) -> None:
        spec = dims[dim]
        if not spec.contains(value):
            raise BindingError(f"{where}: dim {dim}={value} is outside its bounds "
                               f"{spec.describe()}")
        bindings[dim] = value
        origin[dim] = where

    progress = True
    while pending and progress:
        progress = False
        waiting = []
        for name, axis, expr, size in pending:
            where = f"input {name!r} axis {axis}"
            value = _evaluate(expr, bindings, where)
            if value is not None:
                if value != size and isinstance(expr, str):
                    raise BindingError(
                        f"{where}: dim {expr} is {size} here, but {origin[expr]} bound it "
                        f"to {value}"
                    )
                if value != size and isinstance(expr, int):
                    raise BindingError(f"{where}: expected {value}, got {size}")
                if value != size:
                    raise BindingError(
                        f"{where}: expected {fmt(expr)} = {value} "
                        f"(with {_bound_text(expr, bindings)}), got {size}"
                    )
                progress = True
            elif _solve(expr, size, bindings, lambda d, v: bind(d, v, where), where):
                progress = True
            else:
                waiting.append((name, axis, expr, size))
        pending = waiting
    if pending:
        name, axis, expr, size = pending[0]
        raise BindingError(
            f"input {name!r} axis {axis}: cannot bind {fmt(expr)} = {size} "
            "(more than one unknown dim; bind them through other inputs)"
        )
    return bindings


def _solve(expr: Expr, value: int, bindings: Mapping[str, int], bind, where: str) -> bool:
    """Assign the single unknown in ``expr`` so that it equals ``value``; False
    when more than one name is unknown."""
    if isinstance(expr, str):
        bind(expr, value)
        return True
    if isinstance(expr, int):
        return True
    left, right = _evaluate(expr.left, bindings, where), _evaluate(expr.right, bindings, where)
    if left is None and right is None:
        return False
    known, unknown_side = (left, expr.right) if left is not None else (right, expr.left)
    op = expr.op
    if op == "+":
        return _solve(unknown_side, value - known, bindings, bind, where)
    if op == "-":
        if left is not None:  # known - x = value
            return _solve(unknown_side, known - value, bindings, bind, where)
        return _solve(unknown_side, value + known, bindings, bind, where)
    if op == "*":
        if known == 0 or value % known:
            raise BindingError(f"{where}: {value} is not a multiple of {known} "
                               f"(shape entry {fmt(expr)})")
        return _solve(unknown_side, value // known, bindings, bind, where)
    raise BindingError(f"{where}: cannot solve {fmt(expr)} = {value} for its unknown dim "
                       "(// and % cannot be inverted; bind the dim through another input)")


def _evaluate(expr: Expr, bindings: Mapping[str, int], where: str) -> int | None:
    """:func:`evaluate`, with a division by zero under ``bindings`` a
    :class:`BindingError` at ``where``."""
    try:
        return evaluate(expr, bindings)
    except ValueError as exc:
        raise BindingError(f"{where}: {exc}") from None


def _shape_text(shape: list[Expr]) -> str:
    return "[" + ", ".join(fmt(e) for e in shape) + "]"


def _bound_text(expr: Expr, bindings: Mapping[str, int]) -> str:
    return ", ".join(f"{n}={bindings[n]}" for n in sorted(names(expr))) or "no dims"



# -- buckets -------------------------------------------------------------------

BucketPolicy = Any  # "pow2" or a sorted list of sizes


def check_buckets(buckets: Mapping[str, Any], dims: Mapping[str, DimSpec]) -> dict[str, BucketPolicy]:
    """The bucket policies of ``compile(buckets=...)``, checked against the
    program's dims and normalised (size lists sorted)."""
    for dim, policy in buckets.items():
        if dim not in dims:
            raise BindingError(f"buckets names unknown dim {dim!r} "
                               f"(dims: {', '.join(sorted(dims))})")
        if policy != "pow2" and not (
            isinstance(policy, (list, tuple)) and policy and all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in policy)
        ):
            raise BindingError(f"bucket policy for {dim!r} must be 'pow2' or a list of sizes, "
                               f"got {policy!r}")
    return {d: (p if p == "pow2" else sorted(p)) for d, p in buckets.items()}


def bucket(value: int, policy: BucketPolicy, spec: DimSpec) -> int:
    """The bucket a dim value is padded up to (the value itself if no bucket fits)."""
    if policy == "pow2":
        size = 1
        while size < value:
            size *= 2
    else:
        size = next((b for b in policy if b >= value), value)
    if spec.max is not None and size > spec.max:
        size = max(value, spec.max)
    return size


def pad(value: mx.array, declared: Sequence[Expr], bindings: Mapping[str, int]) -> mx.array:
    """Zero-pad each symbolic axis at its end to its size under ``bindings``."""
    widths = [(0, evaluate(e, bindings) - size) for e, size in zip(declared, value.shape)]
    if not any(high for _, high in widths):
        return value
    return mx.pad(value, widths)


def unpad(value: mx.array, shape: Sequence[Expr | None], bindings: Mapping[str, int]) -> mx.array:
    """Cut each output axis whose size is a dim expression back to its true size."""
    index = tuple(slice(0, evaluate(e, bindings)) if e is not None and not isinstance(e, int)
                  else slice(None) for e in shape)
    return value[index] if index else value
