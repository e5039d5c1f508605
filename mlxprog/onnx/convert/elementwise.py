"""Elementwise math: arithmetic (Add Sub Mul Div Pow Mod), the variadic
Max/Min/Sum/Mean, Clip, unary math (Neg Abs Sign Sqrt Reciprocal Exp Log
Ceil Floor Round Erf and the trigonometric/hyperbolic functions), bit ops
(BitShift, BitwiseAnd/Or/Xor/Not) and IsNaN/IsInf.

ONNX keeps the inputs' element type (the inputs of a binary op share it),
so every result here is cast back to it where MLX would promote (MLX's
integer ``divide`` gives floats, for one). Broadcasting is numpy's, as MLX's.

The small helpers (:func:`cast`, :func:`is_float`, :func:`same_dtype`) and
the converter factory :func:`applying` are shared by the other modules of
this family (activations, reduce, logic).
"""

from __future__ import annotations

from functools import reduce as _fold

from ...arrays import is_floating, name_of
from .. import shape_rules
from ..context import Context
from ..registry import Converter, converter, register_made

# -- helpers shared by this family -------------------------------------------------------


def is_float(v) -> bool:
    """Whether builder value ``v`` has a floating element type."""
    return is_floating(v.dtype)


def cast(ctx: Context, v, dtype) -> object:
    """``v`` as ``dtype`` (an ``mx.Dtype`` or a format name); no instruction
    where it already is."""
    name = dtype if isinstance(dtype, str) else name_of(dtype)
    if name_of(v.dtype) == name:
        return v
    return ctx.b.astype(v, dtype=name)


def same_dtype(ctx: Context, v, like) -> object:
    """``v`` cast to ``like``'s element type (a builder value)."""
    return cast(ctx, v, like.dtype)


def trunc_divide(ctx: Context, a, b):
    """Integer division rounding toward zero (C's, and ONNX's ``Div``):
    ``(a - rem(a, b)) // b``, where ``rem`` is the truncating remainder, so
    the floor division is exact (and ``|a - rem| <= |a|`` cannot overflow)."""
    r = ctx.b.remainder(a, b)
    return ctx.b.quotient(ctx.b.subtract(a, r), b)


def floor_mod(ctx: Context, a, b):
    """The remainder with the divisor's sign (numpy's ``mod``, Python's ``%``):
    the truncating remainder, plus ``b`` where it is nonzero and its sign
    differs from ``b``'s."""
    r = ctx.b.remainder(a, b)
    zero = ctx.scalar(0, r)
    fix = ctx.b.logical_and(ctx.b.not_equal(r, zero),
                            ctx.b.not_equal(ctx.b.less(r, zero), ctx.b.less(b, zero)))
    return ctx.b.select(fix, ctx.b.add(r, b), r)


def _inputs(ctx: Context) -> list:
    return [ctx.input(i) for i in range(ctx.num_inputs) if ctx.has_input(i)]


def applying(op: str, arity: int, keep_type: bool = True) -> Converter:
    """A converter applying the builder op ``op`` to the node's first
    ``arity`` inputs; with ``keep_type``, its result is cast to input 0's
    element type where MLX promotes (ONNX keeps it)."""

    def convert(ctx: Context) -> list:
        operands = [ctx.input(i) for i in range(arity)]
        result = getattr(ctx.b, op)(*operands)
        return [same_dtype(ctx, result, operands[0]) if keep_type else result]

    return convert


def _binary(onnx_op: str, op: str, what: str, **traits) -> None:
    register_made(onnx_op, applying(op, 2), f"``{what}``, broadcasting; the inputs' element type.",
                  **traits)


# -- binary arithmetic --------------------------------------------------------------------

_binary("Add", "add", "a + b", layout_free=True, shape_rule=shape_rules.ADD)
_binary("Sub", "subtract", "a - b", layout_free=True, shape_rule=shape_rules.SUB)
_binary("Mul", "multiply", "a * b", layout_free=True, shape_rule=shape_rules.MUL)


@converter("Div", layout_free=True, shape_rule=shape_rules.DIV)
def div(ctx: Context) -> list:
    """``a / b``; integers divide truncating toward zero (ONNX's and the
    reference's ``astype`` of the true quotient). Integer division by zero
    is undefined in ONNX (here: 0)."""
    a, b = ctx.input(0), ctx.input(1)
    if is_float(a):
        return [same_dtype(ctx, ctx.b.divide(a, b), a)]
    return [same_dtype(ctx, trunc_divide(ctx, a, b), a)]


@converter("Pow", layout_free=True)
def pow_(ctx: Context) -> list:
    """``a ** b`` in ``a``'s element type (the exponent may be of another
    type): an integer base with a float exponent is computed in floats and
    truncated back; float bases take the exponent as their own type."""
    a, b = ctx.input(0), ctx.input(1)
    if is_float(a) or not is_float(b):
        return [same_dtype(ctx, ctx.b.pow(a, same_dtype(ctx, b, a)), a)]
    return [same_dtype(ctx, ctx.b.pow(same_dtype(ctx, a, b), b), a)]


@converter("Mod")
def mod(ctx: Context) -> list:
    """Remainder: ``fmod=0`` takes the divisor's sign (numpy's ``mod``),
    ``fmod=1`` the dividend's (C's ``fmod``)."""
    a, b = ctx.input(0), ctx.input(1)
    if ctx.choice("fmod", (0, 1), 0):
        return [same_dtype(ctx, ctx.b.remainder(a, b), a)]
    return [same_dtype(ctx, floor_mod(ctx, a, b), a)]


# -- variadic ----------------------------------------------------------------------------------


def _variadic(onnx_op: str, op: str, what: str, **traits) -> None:
    def convert(ctx: Context) -> list:
        xs = _inputs(ctx)
        return [same_dtype(ctx, _fold(getattr(ctx.b, op), xs), xs[0])]

    register_made(onnx_op, convert,
                  f"{what} of one or more inputs, broadcasting (NaN propagates).",
                  name=f"{onnx_op.lower()}_variadic", layout_free=True, **traits)


_variadic("Max", "max", "Elementwise maximum", shape_rule=shape_rules.MAX)
_variadic("Min", "min", "Elementwise minimum", shape_rule=shape_rules.MIN)
_variadic("Sum", "add", "Elementwise sum")


@converter("Mean", layout_free=True)
def mean_variadic(ctx: Context) -> list:
    """Elementwise mean of one or more inputs, broadcasting: their sum over
    their count (integers: truncated, as the reference's ``astype``)."""
    xs = _inputs(ctx)
    total = _fold(ctx.b.add, xs)
    if len(xs) == 1:
        return [total]
    count = ctx.scalar(len(xs), total)
    if is_float(total):
        return [ctx.b.divide(total, count)]
    return [trunc_divide(ctx, total, count)]


@converter("Clip", layout_free=True)
def clip(ctx: Context) -> list:
    """``min(max(x, lo), hi)`` with each bound optional (inputs 1 and 2, opset
    11+; the importer converts older models first); where ``lo > hi`` all give ``hi``
    (numpy's ``clip``)."""
    x = ctx.input(0)
    lo = ctx.input(1) if ctx.has_input(1) else None
    hi = ctx.input(2) if ctx.has_input(2) else None
    y = x
    if lo is not None:
        y = ctx.b.max(y, same_dtype(ctx, lo, x))
    if hi is not None:
        y = ctx.b.min(y, same_dtype(ctx, hi, x))
    return [y]


# -- unary -------------------------------------------------------------------------------------

def _unary(onnx_op: str, op: str, doc: str, **traits) -> None:
    register_made(onnx_op, applying(op, 1), f"{doc} The input's element type.", **traits)


_unary("Neg", "negate", "``-x``.", layout_free=True, shape_rule=shape_rules.NEG)
_unary("Abs", "abs", "``|x|``.", layout_free=True)
_unary("Sqrt", "sqrt", "Square root (NaN below 0).", layout_free=True)
_unary("Exp", "exp", "``e ** x``.", layout_free=True)
_unary("Log", "log", "Natural logarithm.", layout_free=True)
# Shape values hold integers, which rounding keeps.
_unary("Ceil", "ceil", "Round up.", layout_free=True, shape_rule=shape_rules.UNCHANGED)
_unary("Floor", "floor", "Round down.", layout_free=True, shape_rule=shape_rules.UNCHANGED)
_unary("Round", "round", "Round half to even.", layout_free=True)
_unary("Erf", "erf", "Error function.", layout_free=True)
_unary("Sin", "sin", "Sine.")
_unary("Cos", "cos", "Cosine.")
_unary("Tan", "tan", "Tangent.")
_unary("Asin", "asin", "Inverse sine.")
_unary("Acos", "acos", "Inverse cosine.")
_unary("Atan", "atan", "Inverse tangent.")
_unary("Sinh", "sinh", "Hyperbolic sine.")
_unary("Cosh", "cosh", "Hyperbolic cosine.")
_unary("Asinh", "asinh", "Inverse hyperbolic sine.")
_unary("Acosh", "acosh", "Inverse hyperbolic cosine.")
_unary("Atanh", "atanh", "Inverse hyperbolic tangent.")
_unary("BitwiseNot", "bitwise_not", "Bitwise complement.")


@converter("Reciprocal", layout_free=True)
def reciprocal(ctx: Context) -> list:
    """``1 / x`` (ONNX defines it for floats)."""
    x = ctx.input(0)
    if is_float(x):
        return [ctx.b.reciprocal(x)]
    return [trunc_divide(ctx, ctx.scalar(1, x), x)]


@converter("Sign", layout_free=True)
def sign(ctx: Context) -> list:
    """-1, 0 or 1 by sign; NaN stays NaN (numpy's, where MLX's sign gives 0)."""
    x = ctx.input(0)
    s = same_dtype(ctx, ctx.b.sign(x), x)
    if is_float(x):
        s = ctx.b.select(ctx.b.is_nan(x), x, s)
    return [s]


# -- bits --------------------------------------------------------------------------------------


@converter("BitShift")
def bit_shift(ctx: Context) -> list:
    """``x << y`` or ``x >> y`` by ``direction`` (unsigned integers; an amount
    outside ``[0, bits)`` shifts every bit out)."""
    x, y = ctx.input(0), ctx.input(1)
    op = {"LEFT": "left_shift", "RIGHT": "right_shift"}[ctx.choice("direction",
                                                                    ("LEFT", "RIGHT"))]
    return [same_dtype(ctx, getattr(ctx.b, op)(x, same_dtype(ctx, y, x)), x)]


for _onnx, _op, _what in (("BitwiseAnd", "bitwise_and", "a & b"),
                          ("BitwiseOr", "bitwise_or", "a | b"),
                          ("BitwiseXor", "bitwise_xor", "a ^ b")):
    register_made(_onnx, applying(_op, 2), f"``{_what}``, broadcasting (integers).")


# -- classification ---------------------------------------------------------------------------


@converter("IsNaN")
def is_nan(ctx: Context) -> list:
    """Whether each element is NaN (bool)."""
    x = ctx.input(0)
    if not is_float(x):
        return [ctx.b.not_equal(x, x)]
    return [ctx.b.is_nan(x)]


@converter("IsInf")
def is_inf(ctx: Context) -> list:
    """Whether each element is infinite (bool), of the signs chosen by
    ``detect_positive`` and ``detect_negative`` (both by default)."""
    x = ctx.input(0)
    positive = ctx.choice("detect_positive", (0, 1), 1)
    negative = ctx.choice("detect_negative", (0, 1), 1)
    if not is_float(x) or not (positive or negative):
        return [ctx.b.less(ctx.b.abs(x), ctx.scalar(0, x))]  # all false, x's shape
    inf = ctx.b.is_infinity(x)
    if positive and negative:
        return [inf]
    zero = ctx.scalar(0, x)
    side = ctx.b.greater(x, zero) if positive else ctx.b.less(x, zero)
    return [ctx.b.logical_and(inf, side)]


del _onnx, _op, _what
