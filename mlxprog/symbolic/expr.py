"""Dim expressions: integers, dim names, ``+ - *``, ``//``, ``%`` and
parentheses (``"B*T"``, ``"S-1"``), parsed, evaluated, and printed in a
simplified polynomial form.

An expression has at most :data:`MAX_LENGTH` characters, which bounds how
deep every recursive step here goes, and never divides by an expression that
is identically zero (``"T//0"``, ``"T%(T-T)"``); a divisor that is zero only
for some values fails when it is evaluated there."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Mapping, Union

from ..format.program import DimSpec

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

MAX_LENGTH = 256
"""The longest dim expression, in characters."""

_MAX_TERMS = 64
"""Polynomials with more terms are printed as written (expanding products of
sums of distinct dims grows exponentially)."""


def is_dim_name(name: str) -> bool:
    """True for a valid dim name (an identifier)."""
    return bool(_NAME.match(name))

Expr = Union[int, str, "BinOp"]


@dataclass(frozen=True)
class BinOp:
    """``left op right`` with op one of ``+ - * // %``."""

    op: str
    left: Expr
    right: Expr

    def __str__(self) -> str:
        return f"({_operand(self.left)}{self.op}{_operand(self.right)})"


def _operand(expr: Expr) -> str:
    # An operand prints in parentheses unless it is an atom (a name, a
    # non-negative integer) or already in them (an operation printed as written).
    poly = to_poly(expr)
    if poly is None:
        return str(expr)
    text = poly_str(poly)
    return text if _NAME.match(text) or text.isdigit() else f"({text})"


_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}


def parse(text: str) -> Expr:
    """Parse a dim expression; ValueError (saying why) when it is not one."""
    if len(text) > MAX_LENGTH:
        raise ValueError(f"dim expression {text[:40]!r}... has {len(text)} characters; "
                         f"the most is {MAX_LENGTH}")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):  # ValueError: a null byte
        raise ValueError(f"{text!r} is not a dim expression") from None
    return _convert(tree, text)


def _convert(node: ast.AST, text: str) -> Expr:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        expr = BinOp(_OPS[type(node.op)], _convert(node.left, text), _convert(node.right, text))
        if expr.op in ("//", "%") and to_poly(expr.right) == {}:
            raise ValueError(f"{text!r} divides by zero (a divisor that is always 0)")
        return expr
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
        raise ValueError(f"division by zero in {fmt(expr)} (the divisor {fmt(expr.right)} is 0 "
                         f"with {_bound(expr, bindings)})")
    return left // right if expr.op == "//" else left % right


def _bound(expr: Expr, bindings: Mapping[str, int]) -> str:
    return ", ".join(f"{n}={bindings[n]}" for n in sorted(names(expr))) or "no dims"


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
    on something that is not a constant multiple (or has over
    :data:`_MAX_TERMS` terms)."""
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
        return _bounded({m: c for m, c in out.items() if c})
    if expr.op == "*":
        out: Poly = {}
        for m1, c1 in left.items():
            for m2, c2 in right.items():
                mono = tuple(sorted(m1 + m2))
                out[mono] = out.get(mono, 0) + c1 * c2
        return _bounded({m: c for m, c in out.items() if c})
    if set(right) <= {()}:
        divisor = right.get((), 0)
        if divisor and expr.op == "//" and all(c % divisor == 0 for c in left.values()):
            return {m: c // divisor for m, c in left.items()}
    return None


def _bounded(poly: Poly) -> Poly | None:
    return poly if len(poly) <= _MAX_TERMS else None


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
    """Parse one shape entry: an int, or an expression over declared dims (a
    string naming none, like ``"1"``, is refused: the format does not read
    numbers from strings)."""
    if isinstance(value, int):
        return value
    expr = parse(value)
    used = names(expr)
    if not used:
        raise ValueError(f"{value!r} is a string naming no dim; write a number as a JSON number")
    unknown = used - set(dims)
    if unknown:
        declared = ", ".join(sorted(dims)) or "none declared"
        raise ValueError(
            f"unknown dim {sorted(unknown)[0]!r} in {value!r} (dims: {declared})"
        )
    return expr


