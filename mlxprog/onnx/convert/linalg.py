"""Linear algebra: MatMul, Gemm, Einsum, MatMulInteger, Det.

``matmul`` computes integer (and bool) operands exactly; ``einsum`` takes
floating operands only (as MLX), so an integer Einsum is refused.
"""

from __future__ import annotations

import numpy as np

from ..context import Context
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
        if not np.issubdtype(ctx.dtype(i), np.floating):
            raise ctx.fail(f"input {i} is {ctx.dtype(i)}: MLX's einsum takes floating "
                           "operands only")
    return [ctx.b.einsum(*[ctx.input(i) for i in given], subscripts=equation)]


@converter("MatMulInteger")
def matmul_integer(ctx: Context) -> list:
    """``(A - a_zero_point) @ (B - b_zero_point)`` in int32 (zero points:
    scalars, or per row of A / per column of B)."""
    b = ctx.b
    a = b.astype(ctx.input(0), dtype="int32")
    bb = b.astype(ctx.input(1), dtype="int32")
    if ctx.has_input(2):
        zp = b.astype(ctx.input(2), dtype="int32")
        if zp.ndim == 1 and zp.shape[0] != 1:  # per row of A: [M] -> [M, 1]
            zp = b.expand_dims(zp, axes=[1])
        a = b.subtract(a, zp)
    if ctx.has_input(3):
        zp = b.astype(ctx.input(3), dtype="int32")
        bb = b.subtract(bb, zp)
    return [b.matmul(a, bb)]


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
