"""Linear algebra: MatMul, Gemm, Einsum, MatMulInteger, QLinearMatMul, Det.

``matmul`` computes integer (and bool) operands exactly; ``einsum`` takes
floating operands only (as MLX), so an integer Einsum is refused.
"""

from __future__ import annotations

import numpy as np

from ..context import Context
from ..dtypes import dtype_name, is_float_dtype
from ..registry import converter


@converter("MatMul")
def matmul(ctx: Context) -> list:
    """numpy ``matmul``: 1-D operands as vectors, batch axes broadcast."""
    return [ctx.b.matmul(ctx.input(0), ctx.input(1))]


@converter("Gemm")
def gemm(ctx: Context) -> list:
    """``alpha * A' @ B' + beta * C`` (``A'``: A transposed when ``transA``,
    ``B'`` likewise; C optional, broadcast to the result)."""
    b = ctx.b
    a, bb = ctx.input(0), ctx.input(1)
    if a.ndim != 2 or bb.ndim != 2:
        raise ctx.fail("A and B must be 2-D")
    if ctx.attr("transA", 0):
        a = b.transpose(a, axes=[1, 0])
    if ctx.attr("transB", 0):
        bb = b.transpose(bb, axes=[1, 0])
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    y = b.matmul(a, bb)
    integer = np.issubdtype(ctx.dtype(0), np.integer)

    def scale(v, factor):
        if factor == 1.0:
            return v
        if integer:
            if factor != int(factor):
                raise ctx.fail(f"a non-integer alpha/beta ({factor}) on integer operands")
            factor = int(factor)
        return b.multiply(v, ctx.scalar(factor, v))

    y = scale(y, alpha)
    if ctx.has_input(2) and beta != 0.0:
        y = b.add(y, scale(ctx.input(2), beta))
    return [y]


@converter("Einsum")
def einsum(ctx: Context) -> list:
    """``numpy.einsum`` of the inputs by ``equation`` (floating dtypes only)."""
    equation = ctx.attr("equation").replace(" ", "")
    given = [i for i in range(ctx.num_inputs) if ctx.has_input(i)]
    for i in given:
        if not is_float_dtype(ctx.dtype(i)):
            raise ctx.fail(f"input {i} is {ctx.dtype(i)}: MLX's einsum takes floating "
                           "operands only")
    return [ctx.b.einsum(*[ctx.input(i) for i in given], subscripts=equation)]


def _integer_matmul(ctx: Context, a: int, a_zero: int, b_: int, b_zero: int):
    """``(A - a_zero_point) @ (B - b_zero_point)`` in int32 of inputs ``a`` and
    ``b_`` and their zero points (optional inputs ``a_zero``/``b_zero``:
    scalars, or per row of A / per column of B). MLX's integer matmul is
    exact (int32 accumulation)."""
    b = ctx.b
    x = b.astype(ctx.input(a), dtype="int32")
    y = b.astype(ctx.input(b_), dtype="int32")
    if ctx.has_input(a_zero):
        x = b.subtract(x, _per_row(ctx, b.astype(ctx.input(a_zero), dtype="int32")))
    if ctx.has_input(b_zero):
        y = b.subtract(y, b.astype(ctx.input(b_zero), dtype="int32"))
    return b.matmul(x, y)


def _per_row(ctx: Context, v):
    """A quantization parameter of A: a per-row ``[M]`` one as ``[M, 1]``."""
    if v.ndim == 1 and v.shape[0] != 1:
        return ctx.b.expand_dims(v, axes=[1])
    return v


@converter("MatMulInteger")
def matmul_integer(ctx: Context) -> list:
    """``(A - a_zero_point) @ (B - b_zero_point)`` in int32 (zero points:
    scalars, or per row of A / per column of B)."""
    return [_integer_matmul(ctx, 0, 2, 1, 3)]


@converter("QLinearMatMul")
def qlinear_matmul(ctx: Context) -> list:
    """The quantized product: the integer product of ``a`` and ``b`` less
    their zero points, times ``a_scale * b_scale / y_scale``, rounded (half
    to even) and saturated into ``y_zero_point``'s type, plus it (scales
    and zero points: scalars, or per row of A / per column of B)."""
    out = np.dtype(ctx.dtype(7))
    if out not in (np.int8, np.uint8):
        raise ctx.fail(f"y_zero_point is {out}: QLinearMatMul's output type must be int8 "
                       "or uint8")
    b = ctx.b
    product = b.astype(_integer_matmul(ctx, 0, 2, 3, 5), dtype="float32")

    def scale(i: int):
        return b.astype(ctx.input(i), dtype="float32")

    factor = b.divide(b.multiply(_per_row(ctx, scale(1)), scale(4)), scale(6))
    y = b.round(b.multiply(product, factor))
    y = b.add(y, b.astype(ctx.input(7), dtype="float32"))
    info = np.iinfo(out)
    y = b.clip(y, b.constant(float(info.min), "float32"), b.constant(float(info.max), "float32"))
    return [b.astype(y, dtype=dtype_name(out))]


@converter("Det")
def det(ctx: Context) -> list:
    """The determinant of the last two (square) axes: from the LU
    factorization, the product of ``U``'s diagonal times the sign of the row
    permutation (``-1`` to the number of its inversions)."""
    dims = list(ctx.shape(0))
    if len(dims) < 2 or dims[-1] != dims[-2] or not isinstance(dims[-1], int):
        raise ctx.fail(f"the input must end in a static square matrix (shape {dims})")
    n = dims[-1]
    b = ctx.b
    x = ctx.input(0)
    dtype = np.dtype(ctx.dtype(0))
    if dtype != np.float32:
        raise ctx.fail(f"{dtype} input: MLX's LU factorization takes float32 only")
    if n == 0:
        return [b.full(shape=dims[:-2], dtype="float32", value=1.0)]
    pivots, _, u = b.lu(x)
    eye = b.eye(n=n, dtype="float32")
    diag = b.sum(b.multiply(u, eye), axes=[-1])
    magnitude = b.product(diag, axes=[-1])
    p = b.astype(pivots, dtype="int32")
    later = b.greater(b.expand_dims(p, axes=[-1]), b.expand_dims(p, axes=[-2]))
    upper = b.less(b.iota(shape=[n, n], dtype="int32", axis=0),
                   b.iota(shape=[n, n], dtype="int32", axis=1))
    inversions = b.sum(b.astype(b.logical_and(later, upper), dtype="int32"), axes=[-2, -1])
    odd = b.equal(b.remainder(inversions, b.constant(2, "int32")), b.constant(1, "int32"))
    return [b.select(odd, b.negate(magnitude), magnitude)]
