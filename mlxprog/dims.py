"""Symbolic dimensions: dim expressions, binding from input shapes, specialisation.

A program may declare named dims (``"dims": {"T": {"min": 1, "max": 8192}}``),
use them in input shapes (``[1, "T", 576]``) and in integer-valued attributes
(``"shape": ["B*T", 576]``). Expressions use integers, dim names, ``+ - *``,
``//``, ``%`` and parentheses.

At call time the dims are bound from the actual input shapes
(:func:`bind_dims`); the program is then specialised to concrete shapes
(:func:`specialize`) and validated and compiled like any static program.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any, Mapping, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import BindingError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class DimSpec(BaseModel):
    """Bounds of a named dim (inclusive); ``max`` None means unbounded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min: int = Field(default=1, ge=0)
    max: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> DimSpec:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max {self.max} is below min {self.min}")
        return self

    def contains(self, value: int) -> bool:
        """True when ``value`` lies within the bounds."""
        return value >= self.min and (self.max is None or value <= self.max)

    def describe(self) -> str:
        """The bounds as ``[min, max]``."""
        return f"[{self.min}, {'inf' if self.max is None else self.max}]"


# -- expressions ---------------------------------------------------------------

Expr = Union[int, str, "BinOp"]


@dataclass(frozen=True)
class BinOp:
    """``left op right`` with op one of ``+ - * // %``."""

    op: str
    left: Expr
    right: Expr

    def __str__(self) -> str:
        return f"({fmt(self.left)}{self.op}{fmt(self.right)})"


_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}


def parse(text: str) -> Expr:
    """Parse a dim expression; ValueError (saying why) when it is not one."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise ValueError(f"{text!r} is not a dim expression") from None
    return _convert(tree, text)


def _convert(node: ast.AST, text: str) -> Expr:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return BinOp(_OPS[type(node.op)], _convert(node.left, text), _convert(node.right, text))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return BinOp("-", 0, _convert(node.operand, text))
    raise ValueError(
        f"{text!r} is not a dim expression (integers, dim names, + - * // % and parentheses)"
    )


def names(expr: Expr) -> set[str]:
    """The dim names an expression uses."""
    if isinstance(expr, str):
        return {expr}
    if isinstance(expr, BinOp):
        return names(expr.left) | names(expr.right)
    return set()


def evaluate(expr: Expr, bindings: Mapping[str, int]) -> int | None:
    """The expression's value, or None while one of its names is unbound."""
    if isinstance(expr, int):
        return expr
    if isinstance(expr, str):
        return bindings.get(expr)
    left, right = evaluate(expr.left, bindings), evaluate(expr.right, bindings)
    if left is None or right is None:
        return None
    if expr.op == "+":
        return left + right
    if expr.op == "-":
        return left - right
    if expr.op == "*":
        return left * right
    if right == 0:
        raise ValueError(f"division by zero in {fmt(expr)}")
    return left // right if expr.op == "//" else left % right


def fmt(expr: Expr) -> str:
    """An expression as text, simplified where it is a polynomial."""
    poly = to_poly(expr)
    if poly is not None:
        return poly_str(poly)
    return str(expr)


# Polynomial normal form: {monomial (sorted tuple of names): coefficient}.
Poly = dict[tuple[str, ...], int]


def to_poly(expr: Expr) -> Poly | None:
    """The expression as a polynomial in its names, or None if it uses // or %
    on something that is not a constant multiple."""
    if isinstance(expr, int):
        return {(): expr} if expr else {}
    if isinstance(expr, str):
        return {(expr,): 1}
    left, right = to_poly(expr.left), to_poly(expr.right)
    if left is None or right is None:
        return None
    if expr.op in "+-":
        sign = 1 if expr.op == "+" else -1
        out = dict(left)
        for mono, coeff in right.items():
            out[mono] = out.get(mono, 0) + sign * coeff
        return {m: c for m, c in out.items() if c}
    if expr.op == "*":
        out: Poly = {}
        for m1, c1 in left.items():
            for m2, c2 in right.items():
                mono = tuple(sorted(m1 + m2))
                out[mono] = out.get(mono, 0) + c1 * c2
        return {m: c for m, c in out.items() if c}
    if set(right) <= {()}:
        divisor = right.get((), 0)
        if divisor and expr.op == "//" and all(c % divisor == 0 for c in left.values()):
            return {m: c // divisor for m, c in left.items()}
    return None


def poly_str(poly: Poly) -> str:
    """A polynomial as text: ``2*B*T+1``."""
    if not poly:
        return "0"
    terms = []
    for mono in sorted(poly, key=lambda m: (-len(m), m)):
        coeff = poly[mono]
        body = "*".join(mono)
        if not body:
            text = str(abs(coeff))
        elif abs(coeff) == 1:
            text = body
        else:
            text = f"{abs(coeff)}*{body}"
        terms.append(("-" if coeff < 0 else "+", text))
    first_sign, first = terms[0]
    out = ("-" if first_sign == "-" else "") + first
    return out + "".join(f"{sign}{text}" for sign, text in terms[1:])


def parse_dim(value: int | str, dims: Mapping[str, DimSpec]) -> Expr:
    """Parse one shape entry: an int, or an expression over declared dims."""
    if isinstance(value, int):
        return value
    expr = parse(value)
    unknown = names(expr) - set(dims)
    if unknown:
        declared = ", ".join(sorted(dims)) or "none declared"
        raise ValueError(
            f"unknown dim {sorted(unknown)[0]!r} in {value!r} (dims: {declared})"
        )
    return expr


# -- binding -------------------------------------------------------------------


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
            value = evaluate(expr, bindings)
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
    left, right = evaluate(expr.left, bindings), evaluate(expr.right, bindings)
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


def _shape_text(shape: list[Expr]) -> str:
    return "[" + ", ".join(fmt(e) for e in shape) + "]"


def _bound_text(expr: Expr, bindings: Mapping[str, int]) -> str:
    return ", ".join(f"{n}={bindings[n]}" for n in sorted(names(expr))) or "no dims"


# -- specialisation --------------------------------------------------------------


def is_dim_name(name: str) -> bool:
    """True for a valid dim name (an identifier)."""
    return bool(_NAME.match(name))


def substitute(value: Any, dims: Mapping[str, DimSpec], bindings: Mapping[str, int] | None,
               where: str) -> tuple[Any, bool]:
    """Replace dim-expression strings inside an int-valued attribute (nested
    lists allowed) by their values. Returns ``(value, used_dims)``; with
    ``bindings`` None only checks the expressions."""
    if isinstance(value, str):
        try:
            expr = parse_dim(value, dims)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if bindings is None:
            return value, True
        result = evaluate(expr, bindings)
        return result, True
    if isinstance(value, list):
        used = False
        out = []
        for item in value:
            new, flag = substitute(item, dims, bindings, where)
            out.append(new)
            used |= flag
        return out, used
    return value, False


def sample_bindings(dims: Mapping[str, DimSpec]) -> list[dict[str, int]]:
    """Bindings used to check a symbolic program statically: every dim at its
    minimum, then two assignments of distinct, generic values (odd and even)
    within the bounds."""
    odd = [7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47]
    even = [6, 10, 14, 22, 26, 34, 38, 46, 58, 62, 74, 82]
    samples = [{d: spec.min for d, spec in dims.items()}]
    for pool in (odd, even):
        sample = {}
        for i, (d, spec) in enumerate(sorted(dims.items())):
            value = pool[i % len(pool)] * (1 + i // len(pool))
            if not spec.contains(value):
                value = spec.max if spec.max is not None and value > spec.max else spec.min
            sample[d] = value
        samples.append(sample)
    unique = []
    for s in samples:
        if s not in unique:
            unique.append(s)
    return unique
