"""Activations: Relu LeakyRelu PRelu Elu Selu Celu Sigmoid HardSigmoid
HardSwish Tanh Softplus Softsign ThresholdedRelu Gelu Mish Swish Shrink,
and the normalisations over one axis Softmax LogSoftmax Hardmax (opset 13+:
``axis`` names the one axis, default -1).

Each keeps its input's element type: float attributes (``alpha``, ...)
become constants of that type (:meth:`Context.scalar`).
"""

from __future__ import annotations

import math

from ...arrays import name_of
from ..context import Context
from ..registry import converter, register_made
from .elementwise import applying, is_float, same_dtype


def _relu(ctx: Context, x):
    return ctx.b.max(x, ctx.scalar(0, x))


def _clamp01(ctx: Context, x):
    return ctx.b.min(ctx.b.max(x, ctx.scalar(0, x)), ctx.scalar(1, x))


def _softplus(ctx: Context, x):
    """``log(1 + exp(x))`` computed stably: ``max(x, 0) + log1p(exp(-|x|))``."""
    b = ctx.b
    return b.add(_relu(ctx, x), b.log1p(b.exp(b.negate(b.abs(x)))))


def _axis(ctx: Context, rank: int) -> int:
    axis = ctx.attr("axis", -1)
    if not -rank <= axis < max(rank, 1):
        raise ctx.fail(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


register_made("Sigmoid", applying("sigmoid", 1), "``1 / (1 + exp(-x))``.", layout_free=True)
register_made("Tanh", applying("tanh", 1), "Hyperbolic tangent.", layout_free=True)


@converter("Relu", layout_free=True)
def relu(ctx: Context) -> list:
    """``max(x, 0)``."""
    return [_relu(ctx, ctx.input(0))]


@converter("LeakyRelu", layout_free=True)
def leaky_relu(ctx: Context) -> list:
    """``x`` where ``x >= 0``, else ``alpha * x`` (``alpha`` default 0.01)."""
    x = ctx.input(0)
    alpha = ctx.scalar(ctx.attr("alpha", 0.01), x)
    return [ctx.b.select(ctx.b.less(x, ctx.scalar(0, x)), ctx.b.multiply(x, alpha), x)]


@converter("PRelu")
def prelu(ctx: Context) -> list:
    """``x`` where ``x >= 0``, else ``slope * x``; ``slope`` broadcasts to ``x``."""
    x = ctx.input(0)
    slope = same_dtype(ctx, ctx.input(1), x)
    return [ctx.b.select(ctx.b.less(x, ctx.scalar(0, x)), ctx.b.multiply(x, slope), x)]


@converter("Elu", layout_free=True)
def elu(ctx: Context) -> list:
    """``x`` where ``x >= 0``, else ``alpha * (exp(x) - 1)`` (``alpha`` 1.0)."""
    x = ctx.input(0)
    b = ctx.b
    neg = b.multiply(ctx.scalar(ctx.attr("alpha", 1.0), x), b.expm1(x))
    return [b.select(b.less(x, ctx.scalar(0, x)), neg, x)]


@converter("Selu", layout_free=True)
def selu(ctx: Context) -> list:
    """``gamma * x`` where ``x > 0``, else ``gamma * alpha * (exp(x) - 1)``."""
    x = ctx.input(0)
    b = ctx.b
    alpha = ctx.attr("alpha", 1.6732632423543772848170429916717)
    gamma = ctx.attr("gamma", 1.0507009873554804934193349852946)
    neg = b.multiply(ctx.scalar(alpha, x), b.expm1(x))
    y = b.select(b.greater(x, ctx.scalar(0, x)), x, neg)
    return [b.multiply(ctx.scalar(gamma, x), y)]


@converter("Celu", layout_free=True)
def celu(ctx: Context) -> list:
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))`` (``alpha`` 1.0)."""
    x = ctx.input(0)
    b = ctx.b
    alpha = ctx.scalar(ctx.attr("alpha", 1.0), x)
    neg = b.multiply(alpha, b.expm1(b.divide(x, alpha)))
    return [b.add(_relu(ctx, x), b.min(neg, ctx.scalar(0, x)))]


@converter("HardSigmoid", layout_free=True)
def hard_sigmoid(ctx: Context) -> list:
    """``max(0, min(1, alpha * x + beta))`` (``alpha`` 0.2, ``beta`` 0.5)."""
    x = ctx.input(0)
    b = ctx.b
    lin = b.add(b.multiply(x, ctx.scalar(ctx.attr("alpha", 0.2), x)),
                ctx.scalar(ctx.attr("beta", 0.5), x))
    return [_clamp01(ctx, lin)]


@converter("HardSwish", layout_free=True)
def hard_swish(ctx: Context) -> list:
    """``x * max(0, min(1, x / 6 + 0.5))``."""
    x = ctx.input(0)
    b = ctx.b
    lin = b.add(b.multiply(x, ctx.scalar(1 / 6, x)), ctx.scalar(0.5, x))
    return [b.multiply(x, _clamp01(ctx, lin))]


@converter("Softplus", layout_free=True)
def softplus(ctx: Context) -> list:
    """``log(exp(x) + 1)``, computed without overflow for large ``x``."""
    return [_softplus(ctx, ctx.input(0))]


@converter("Softsign", layout_free=True)
def softsign(ctx: Context) -> list:
    """``x / (1 + |x|)``."""
    x = ctx.input(0)
    b = ctx.b
    return [b.divide(x, b.add(b.abs(x), ctx.scalar(1, x)))]


@converter("ThresholdedRelu", layout_free=True)
def thresholded_relu(ctx: Context) -> list:
    """``x`` where ``x > alpha``, else 0 (``alpha`` 1.0)."""
    x = ctx.input(0)
    b = ctx.b
    return [b.select(b.greater(x, ctx.scalar(ctx.attr("alpha", 1.0), x)), x,
                     ctx.scalar(0, x))]


@converter("Gelu", layout_free=True)
def gelu(ctx: Context) -> list:
    """``0.5 * x * (1 + erf(x / sqrt(2)))``; with ``approximate="tanh"``,
    ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))``."""
    x = ctx.input(0)
    b = ctx.b
    half = ctx.scalar(0.5, x)
    if ctx.choice("approximate", ("none", "tanh"), "none") == "none":
        inner = b.erf(b.multiply(x, ctx.scalar(1 / math.sqrt(2), x)))
    else:
        cube = b.multiply(b.multiply(x, x), x)
        arg = b.add(x, b.multiply(cube, ctx.scalar(0.044715, x)))
        inner = b.tanh(b.multiply(arg, ctx.scalar(math.sqrt(2 / math.pi), x)))
    return [b.multiply(b.multiply(half, x), b.add(inner, ctx.scalar(1, x)))]


@converter("Mish", layout_free=True)
def mish(ctx: Context) -> list:
    """``x * tanh(softplus(x))``."""
    x = ctx.input(0)
    return [ctx.b.multiply(x, ctx.b.tanh(_softplus(ctx, x)))]


@converter("Swish")
def swish(ctx: Context) -> list:
    """``x * sigmoid(alpha * x)`` (opset 24; ``alpha`` 1.0)."""
    x = ctx.input(0)
    b = ctx.b
    alpha = ctx.attr("alpha", 1.0)
    inner = x if alpha == 1.0 else b.multiply(x, ctx.scalar(alpha, x))
    return [b.multiply(x, b.sigmoid(inner))]


@converter("Shrink", layout_free=True)
def shrink(ctx: Context) -> list:
    """``x + bias`` where ``x < -lambd``, ``x - bias`` where ``x > lambd``,
    else 0 (``bias`` 0, ``lambd`` 0.5; integer inputs compare against the
    float ``lambd`` exactly and take ``bias`` truncated, as the reference)."""
    x = ctx.input(0)
    b = ctx.b
    lambd, bias = ctx.attr("lambd", 0.5), ctx.attr("bias", 0.0)
    if is_float(x):
        lo, hi, bias_v = ctx.scalar(-lambd, x), ctx.scalar(lambd, x), ctx.scalar(bias, x)
        below, above = b.less(x, lo), b.greater(x, hi)
        plus, minus = b.add(x, bias_v), b.subtract(x, bias_v)
    else:
        # x < -lambd  <=>  x < ceil(-lambd) for integers; x > lambd  <=>  x > floor(lambd).
        below = b.less(x, ctx.scalar(math.ceil(-lambd), x))
        above = b.greater(x, ctx.scalar(math.floor(lambd), x))
        xf = b.astype(x, dtype="float64" if x.dtype.size == 8 else "float32")
        bias_v = ctx.scalar(bias, xf)
        plus = same_dtype(ctx, b.add(xf, bias_v), x)
        minus = same_dtype(ctx, b.subtract(xf, bias_v), x)
    zero = ctx.scalar(0, x)
    return [b.select(below, plus, b.select(above, minus, zero))]


# -- over one axis ------------------------------------------------------------------------------


@converter("Softmax")
def softmax(ctx: Context) -> list:
    """``exp(x) / sum(exp(x))`` over ``axis`` (half precision accumulates in
    float32)."""
    x = ctx.input(0)
    axis = _axis(ctx, x.ndim)
    if x.ndim == 0:
        return [ctx.b.add(ctx.b.multiply(x, ctx.scalar(0, x)), ctx.scalar(1, x))]
    return [same_dtype(ctx, ctx.b.softmax(x, axes=[axis], precise=True), x)]


@converter("LogSoftmax")
def log_softmax(ctx: Context) -> list:
    """``x - log(sum(exp(x)))`` over ``axis``, with the maximum subtracted first."""
    x = ctx.input(0)
    b = ctx.b
    axis = _axis(ctx, x.ndim)
    if x.ndim == 0:
        return [b.multiply(x, ctx.scalar(0, x))]
    shifted = b.subtract(x, b.reduce_max(x, axes=[axis], keepdims=True))
    lse = b.log(b.sum(b.exp(shifted), axes=[axis], keepdims=True))
    return [b.subtract(shifted, lse)]


@converter("Hardmax")
def hardmax(ctx: Context) -> list:
    """1 at the first maximum along ``axis``, 0 elsewhere (``x``'s type); an
    empty ``x`` is returned as it is."""
    x = ctx.input(0)
    b = ctx.b
    shape = ctx.shape(0)
    if x.ndim == 0 or 0 in shape:
        return [x if x.ndim else ctx.b.add(ctx.b.multiply(x, ctx.scalar(0, x)),
                                           ctx.scalar(1, x))]
    axis = _axis(ctx, x.ndim)
    best = b.argmax(x, axis=axis, keepdims=True)
    index = b.iota(shape=list(shape), dtype="uint32", axis=axis)
    return [b.astype(b.equal(index, best), dtype=name_of(x.dtype))]


@converter("SwiGLU")
def swiglu(ctx: Context) -> list:
    """``a * sigmoid(alpha * a) * b`` (``alpha`` 1.0); ``a`` and ``b`` have one
    shape and type (no broadcasting)."""
    if ctx.shape(0) != ctx.shape(1) or ctx.dtype(0) != ctx.dtype(1):
        raise ctx.fail(f"inputs A and B must have one shape and type (no broadcasting); "
                       f"found {ctx.dtype(0)}{list(ctx.shape(0))} and "
                       f"{ctx.dtype(1)}{list(ctx.shape(1))}")
    a, gate = ctx.input(0), ctx.input(1)
    b = ctx.b
    alpha = ctx.attr("alpha", 1.0)
    scaled = a if alpha == 1.0 else b.multiply(ctx.scalar(alpha, a), a)
    return [b.multiply(b.multiply(a, b.sigmoid(scaled)), gate)]
