"""Comparisons (Equal Greater GreaterOrEqual Less LessOrEqual) and logic
(And Or Xor Not): bool results, numpy broadcasting."""

from __future__ import annotations

from .. import shape_rules
from ..registry import register_made
from .elementwise import applying


def _compare(onnx_op: str, op: str, what: str, **traits) -> None:
    register_made(onnx_op, applying(op, 2, keep_type=False), f"``{what}``, broadcasting; bool.",
                  **traits)


_compare("Equal", "equal", "a == b", shape_rule=shape_rules.EQUAL)
_compare("Greater", "greater", "a > b")
_compare("GreaterOrEqual", "greater_equal", "a >= b")
_compare("Less", "less", "a < b")
_compare("LessOrEqual", "less_equal", "a <= b")
_compare("And", "logical_and", "a and b")
_compare("Or", "logical_or", "a or b")
_compare("Xor", "logical_xor", "a xor b")
register_made("Not", applying("logical_not", 1, keep_type=False), "Logical negation (bool).",
              name="not_")
