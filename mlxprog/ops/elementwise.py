"""Elementwise ops: casts, unary math, binary arithmetic, comparisons, logic,
``select``, ``clip``. Binary ops broadcast like numpy and promote dtypes like MLX.
"""

from __future__ import annotations

import mlx.core as mx

from ..arrays import to_mlx
from .attrs import Attrs, DType
from .registry import register_family, register_op


class AstypeAttrs(Attrs):
    dtype: DType


@register_op("astype", attrs=AstypeAttrs, shapeless=True)
def astype(operands, attrs):
    """Convert to ``dtype`` (values converted, as ``mx.astype``)."""
    return operands[0].astype(to_mlx(attrs.dtype))


class BitcastAttrs(Attrs):
    dtype: DType


@register_op("bitcast", attrs=BitcastAttrs)
def bitcast(operands, attrs):
    """Reinterpret the bits as ``dtype`` (``mx.view``); a wider or narrower dtype
    changes the size of the last axis accordingly."""
    return mx.view(operands[0], to_mlx(attrs.dtype))


def _unary(fn, operands, attrs):
    """``fn`` applied to the one operand."""
    return fn(operands[0])


_UNARY = {
    "abs": (mx.abs, "Absolute value."),
    "negate": (mx.negative, "Negation."),
    "sign": (mx.sign, "-1, 0 or 1 by sign (bool unchanged). NaN gives 0 and -0.0 gives 0.0, "
                      "as in MLX (numpy and XLA give NaN and -0.0); complex x gives x / |x| "
                      "(0 for 0)."),
    "real": (mx.real, "Real part."),
    "imag": (mx.imag, "Imaginary part."),
    "conjugate": (mx.conjugate, "Complex conjugate."),
    "bitwise_not": (mx.bitwise_invert, "Bitwise complement (integers and bool)."),
    "logical_not": (mx.logical_not, "Logical negation; result is bool."),
    "sigmoid": (mx.sigmoid, "1 / (1 + exp(-x))."),
    "asin": (mx.arcsin, "Inverse sine."),
    "asinh": (mx.arcsinh, "Inverse hyperbolic sine."),
    "acos": (mx.arccos, "Inverse cosine."),
    "acosh": (mx.arccosh, "Inverse hyperbolic cosine."),
    "atan": (mx.arctan, "Inverse tangent."),
    "atanh": (mx.arctanh, "Inverse hyperbolic tangent."),
    "cos": (mx.cos, "Cosine."),
    "cosh": (mx.cosh, "Hyperbolic cosine."),
    "erf": (mx.erf, "Error function."),
    "erf_inv": (mx.erfinv, "Inverse error function."),
    "exp": (mx.exp, "Natural exponential."),
    "expm1": (mx.expm1, "exp(x) - 1, accurate near 0."),
    "log": (mx.log, "Natural logarithm."),
    "log1p": (mx.log1p, "log(1 + x), accurate near 0."),
    "log2": (mx.log2, "Base-2 logarithm."),
    "log10": (mx.log10, "Base-10 logarithm."),
    "rsqrt": (mx.rsqrt, "1 / sqrt(x)."),
    "sin": (mx.sin, "Sine."),
    "sinh": (mx.sinh, "Hyperbolic sine."),
    "sqrt": (mx.sqrt, "Square root."),
    "square": (mx.square, "x * x."),
    "reciprocal": (mx.reciprocal, "1 / x."),
    "tan": (mx.tan, "Tangent."),
    "tanh": (mx.tanh, "Hyperbolic tangent."),
}

register_family(_UNARY, _unary, operands=1, shapeless=True)


def _float_test(fn, operands, attrs):
    """``fn`` on floats; integers and bools are never NaN or infinite. Written
    ``x != x`` for them rather than MLX's constant, which has the traced shape
    and so cannot serve other bindings of a symbolic program."""
    x = operands[0]
    return fn(x) if mx.issubdtype(x.dtype, mx.inexact) else mx.not_equal(x, x)


register_family({
    "is_nan": (mx.isnan, "True where NaN (never, for integers and bools)."),
    "is_infinity": (mx.isinf, "True where +/-Inf (never, for integers and bools)."),
}, _float_test, operands=1, shapeless=True)


def _rounding(fn, operands, attrs):
    """``fn`` on floats; integers and bools are already whole and pass
    unchanged (MLX rounds 64-bit integers through float inside fused
    kernels, which loses their low bits)."""
    x = operands[0]
    return fn(x) if mx.issubdtype(x.dtype, mx.inexact) else x


register_family({
    "ceil": (mx.ceil, "Round up; integers and bools are unchanged."),
    "floor": (mx.floor, "Round down; integers and bools are unchanged."),
    "round": (mx.round, "Round half to even; integers and bools are unchanged."),
}, _rounding, operands=1, shapeless=True)


@register_op("cbrt", shapeless=True)
def cbrt(operands, attrs):
    """Cube root as ``x ** (1/3)``: NaN for negative real inputs, as in the
    reference compiler, except ``-inf``, which gives ``+inf`` (C's ``pow``);
    ``-0.0`` gives ``0.0`` and NaN gives NaN. Integer inputs give ``float32``."""
    x = operands[0]
    return mx.power(x, mx.array(1.0 / 3.0, dtype=_float_of(x.dtype)))


@register_op("erfc", shapeless=True)
def erfc(operands, attrs):
    """Complementary error function, ``1 - erf(x)``."""
    e = mx.erf(operands[0])
    return mx.array(1, dtype=e.dtype) - e


@register_op("silu", shapeless=True)
def silu(operands, attrs):
    """``x * sigmoid(x)`` (swish)."""
    x = operands[0]
    return x * mx.sigmoid(x)


@register_op("gelu", shapeless=True)
def gelu(operands, attrs):
    """Exact GELU, ``0.5 * x * (1 + erf(x / sqrt(2)))``; integer inputs give float32."""
    x = operands[0]
    x = x.astype(_float_of(x.dtype))
    return x * (1 + mx.erf(x / mx.array(2**0.5, dtype=x.dtype))) / mx.array(2, dtype=x.dtype)


def _float_of(dtype: mx.Dtype) -> mx.Dtype:
    return dtype if mx.issubdtype(dtype, mx.inexact) else mx.float32


def _binary(fn, operands, attrs):
    """``fn`` applied to the two operands (broadcasting and promoting as MLX)."""
    return fn(operands[0], operands[1])


_BINARY = {
    "add": (mx.add, "a + b."),
    "subtract": (mx.subtract, "a - b."),
    "multiply": (mx.multiply, "a * b."),
    "divide": (mx.divide, "a / b (true division; integers give floats)."),
    "pow": (mx.power, "a ** b."),
    "atan2": (mx.arctan2, "Angle of (b, a): arctan(a / b) in the right quadrant."),
    "min": (mx.minimum, "Elementwise minimum (NaN propagates)."),
    "max": (mx.maximum, "Elementwise maximum (NaN propagates)."),
    "bitwise_and": (mx.bitwise_and, "a & b."),
    "bitwise_or": (mx.bitwise_or, "a | b."),
    "bitwise_xor": (mx.bitwise_xor, "a ^ b."),
    "equal": (mx.equal, "a == b; result is bool."),
    "not_equal": (mx.not_equal, "a != b; result is bool."),
    "greater": (mx.greater, "a > b; result is bool."),
    "less": (mx.less, "a < b; result is bool."),
    "greater_equal": (mx.greater_equal, "a >= b; result is bool."),
    "less_equal": (mx.less_equal, "a <= b; result is bool."),
    "logical_and": (mx.logical_and, "a and b; result is bool."),
    "logical_or": (mx.logical_or, "a or b; result is bool."),
}

register_family(_BINARY, _binary, operands=2, shapeless=True)


def _shift(fn, operands, attrs):
    """``fn`` with every shift amount defined: an amount outside ``[0, bits)``
    of the result dtype shifts every bit out (C leaves it undefined, and MLX's
    compiled and eager kernels then disagree)."""
    a, amount = operands
    result = fn(a, mx.zeros((), amount.dtype))  # the promoted dtype, for its width
    bits = result.dtype.size * 8
    inside = (amount >= 0) & (amount < bits)
    shifted = fn(a, mx.where(inside, amount, 0))
    filled = mx.zeros((), shifted.dtype)
    if fn is mx.right_shift and mx.issubdtype(shifted.dtype, mx.signedinteger):
        filled = mx.where(a < 0, mx.array(-1, shifted.dtype), filled)  # the sign fills in
    return mx.where(inside, shifted, filled)


register_family({
    "left_shift": (mx.left_shift, "a << b (integers). An amount outside [0, bits) of the "
                                  "result dtype gives 0."),
    "right_shift": (mx.right_shift, "a >> b (integers; arithmetic for signed). An amount "
                                    "outside [0, bits) of the result dtype gives 0, or -1 "
                                    "for a negative signed a."),
}, _shift, operands=2, shapeless=True)


@register_op("logical_xor", operands=2, shapeless=True)
def logical_xor(operands, attrs):
    """Exactly one of a, b is true; result is bool."""
    a, b = operands
    return mx.not_equal(a.astype(mx.bool_), b.astype(mx.bool_))


def _divides_by_minus_one(a: mx.array, b: mx.array) -> bool:
    """Whether integer division of ``a`` by ``b`` can meet a divisor of -1, which
    MLX hands to the CPU's divide instruction: the most negative value divided by
    -1 overflows there, and the process dies of SIGFPE."""
    return mx.issubdtype(a.dtype, mx.integer) and mx.issubdtype(b.dtype, mx.signedinteger)


@register_op("quotient", operands=2, shapeless=True)
def quotient(operands, attrs):
    """Floor division ``a // b``. Integer division by zero gives 0 (as MLX); the
    most negative integer divided by -1 wraps to itself."""
    a, b = operands
    if not _divides_by_minus_one(a, b):
        return mx.floor_divide(a, b)
    by_minus_one = b == -1
    result = mx.floor_divide(a, mx.where(by_minus_one, 1, b))
    return mx.where(by_minus_one, -result, result)


@register_op("remainder", operands=2, shapeless=True)
def remainder(operands, attrs):
    """Truncating remainder: the result has the sign of the dividend (C's ``%``
    and ``fmod``), unlike MLX's floor-mod, as in the reference compiler. Integer
    remainder by zero gives the dividend (as MLX)."""
    a, b = operands
    if mx.issubdtype(a.dtype, mx.inexact) or mx.issubdtype(b.dtype, mx.inexact):
        # Floor-mod and truncation agree on magnitudes; correcting a floor-mod
        # result by subtracting b instead would lose small dividends to rounding
        # and turn an infinite divisor into NaN. Both are promoted first: abs()
        # of the most negative integer overflows in its own dtype.
        dtype = (mx.zeros((), a.dtype) + mx.zeros((), b.dtype)).dtype
        a, b = a.astype(dtype), b.astype(dtype)
        magnitude = mx.remainder(mx.abs(a), mx.abs(b))
        return mx.where(a < 0, -magnitude, magnitude)
    # Integers: exact, and abs() would overflow on the most negative value.
    if _divides_by_minus_one(a, b):
        b = mx.where(b == -1, 1, b)  # the same remainder, 0, without the trap
    rem = mx.remainder(a, b)
    fix = mx.logical_and(mx.not_equal(rem, 0), mx.not_equal(a < 0, b < 0))
    return mx.where(fix, rem - b, rem)


@register_op("select", operands=3, shapeless=True)
def select(operands, attrs):
    """``where(pred, on_true, on_false)``, broadcasting all three."""
    pred, on_true, on_false = operands
    return mx.where(pred, on_true, on_false)


@register_op("clip", operands=3, shapeless=True)
def clip(operands, attrs):
    """Clamp ``x`` into ``[lo, hi]`` (operands x, lo, hi)."""
    x, lo, hi = operands
    return mx.clip(x, lo, hi)
