"""Comparisons (Equal Greater GreaterOrEqual Less LessOrEqual) and logic
(And Or Xor Not): bool results, numpy broadcasting."""

from __future__ import annotations

from ..context import Context
from ..registry import converter, register_made

_COMPARISONS = {
    "Equal": ("equal", "a == b"),
    "Greater": ("greater", "a > b"),
    "GreaterOrEqual": ("greater_equal", "a >= b"),
    "Less": ("less", "a < b"),
    "LessOrEqual": ("less_equal", "a <= b"),
    "And": ("logical_and", "a and b"),
    "Or": ("logical_or", "a or b"),
    "Xor": ("logical_xor", "a xor b"),
}


def _compare(op: str):
    def convert(ctx: Context) -> list:
        return [getattr(ctx.b, op)(ctx.input(0), ctx.input(1))]
    return convert


for _onnx, (_op, _what) in _COMPARISONS.items():
    register_made(_onnx, _compare(_op), f"``{_what}``, broadcasting; bool.")


@converter("Not")
def not_(ctx: Context) -> list:
    """Logical negation (bool)."""
    return [ctx.b.logical_not(ctx.input(0))]


del _onnx, _op, _what
