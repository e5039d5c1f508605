"""Linear algebra, as ``mx.linalg``: factorizations (``cholesky``, ``qr``,
``eigh``, ``svd``, ``lu``), solves, inverses and norms. MLX implements its
factorizations and solves only on the CPU, so these ops run on the CPU stream
and return contiguous arrays: they compose inside compiled programs whatever
the default device. Matrices are the last two axes; leading axes are batch
axes. Inputs must be ``float32`` or ``float64``.

Values are data, so a matrix that LAPACK cannot factor is not an error: a
matrix with a non-finite entry among those the op reads, a singular one
(``inv``, ``solve``, ``solve_triangular``: a zero pivot) or one that is not
positive definite (``cholesky``) gives NaN in every result for that matrix,
and the other matrices of a batch are unaffected. LAPACK never sees such a
matrix (it could fail, or never return). Nor does it see an empty operand (an
empty batch, or matrices with no rows or columns): its results are built
directly, empty, with the identity for the orthogonal factors that keep a
size (``svd``'s ``U`` of an ``(M, 0)`` matrix) and the identity permutation
for ``lu``'s pivots.
"""

from __future__ import annotations

import functools
import math
from typing import Annotated, Literal

import mlx.core as mx
from pydantic import WithJsonSchema, field_validator

from ..arrays import AVal
from .attrs import Attrs, Axes
from .registry import register_op


def _on_cpu(fn):
    """Run an implementation with the CPU as the default stream: MLX factorizes
    only there, and the GPU has no ``float64`` for the ops around the LAPACK
    calls."""

    @functools.wraps(fn)
    def on_cpu(operands, attrs):
        with mx.stream(mx.cpu):
            return fn(operands, attrs)

    return on_cpu


def _contiguous(*arrays: mx.array) -> mx.array | tuple[mx.array, ...]:
    """Contiguous copies of linalg results, which MLX may return as strided
    views."""
    out = tuple(mx.contiguous(a) for a in arrays)
    return out[0] if len(out) == 1 else out


def _finite(a: mx.array, triangle: Literal["L", "U"] | None = None) -> mx.array:
    """One bool per matrix of ``a`` (shape ``batch + (1, 1)``): whether every
    entry the op reads is finite: all of them, or only those on and below
    (``"L"``) or on and above (``"U"``) the diagonal."""
    finite = mx.isfinite(a)
    if triangle is not None:
        m, n = a.shape[-2:]
        ignored = (mx.tri(m, n, k=-1, dtype=mx.bool_) if triangle == "U"
                   else mx.logical_not(mx.tri(m, n, dtype=mx.bool_)))
        finite = mx.logical_or(finite, ignored)
    return mx.all(finite, axis=(-2, -1), keepdims=True)


def _nan_unless(ok: mx.array, x: mx.array, matrix_axes: int = 2) -> mx.array:
    """``x`` with NaN for every matrix whose ``ok`` (as :func:`_finite`) is
    false; the last ``matrix_axes`` axes of ``x`` belong to one matrix."""
    ok = mx.reshape(ok, [*ok.shape[:-2], *[1] * matrix_axes])
    return mx.where(ok, x, math.nan)


def _invertible_triangular(a: mx.array, upper: bool) -> tuple[mx.array, mx.array]:
    """``(ok, safe)`` for triangular matrices: whether LAPACK can invert each
    one (the triangle read is finite and the diagonal has no zero), and ``a``
    with the identity in place of those it cannot."""
    nonzero = mx.all(mx.diagonal(a, axis1=-2, axis2=-1) != 0, axis=-1)
    ok = mx.logical_and(_finite(a, "U" if upper else "L"), nonzero[..., None, None])
    return ok, mx.where(ok, a, mx.eye(a.shape[-1], dtype=a.dtype))


def _identity(a: mx.array, size: int) -> mx.array:
    """The ``size`` x ``size`` identity for each matrix of ``a``'s batch."""
    return mx.broadcast_to(mx.eye(size, dtype=a.dtype), [*a.shape[:-2], size, size])


def _lu(a: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """``mx.linalg.lu`` of any operand shape."""
    *batch, m, n = a.shape
    if a.size == 0:
        # Not for MLX, which divides by m * n (SIGFPE) and hands LAPACK an
        # empty batch: the factors are empty (or have no matrices) and the
        # rows stay in place.
        k = min(m, n)
        pivots = mx.broadcast_to(mx.arange(m, dtype=mx.uint32), [*batch, m])
        return pivots, mx.zeros([*batch, m, k], a.dtype), mx.zeros([*batch, k, n], a.dtype)
    if a.ndim > 2:
        return tuple(mx.linalg.lu(a))
    # MLX 0.32 records the element count of its LU buffer as its byte count
    # and flags a 2-D one column-contiguous, which sends the extraction of L
    # and U down a path that trusts the count: it writes past the buffer
    # (heap corruption for a 1x1 matrix). A batch axis of one clears the flag.
    return tuple(x[0] for x in mx.linalg.lu(a[None]))


def _empty_solution(a: mx.array, b: mx.array) -> mx.array:
    """The solution of ``A @ X = B`` when ``A`` or ``B`` is empty: zeros
    shaped as ``A @ B``, with no LAPACK call (empty, or with no
    right-hand sides, or 0x0 systems whose solution has no entries)."""
    shape = mx.matmul(a, b)  # lazy: only its shape and dtype are read
    return mx.zeros(shape.shape, shape.dtype)


def _check_square(avals: list[AVal], attrs) -> None:
    """Operand 0 is a (batch of) square matrices."""
    shape = list(avals[0].shape)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ValueError(
            f"operand 0 must be a square matrix (or a batch of them in the last "
            f"two axes); found shape {shape}"
        )


def _check_solve(avals: list[AVal], attrs) -> None:
    """``A`` (operand 0) is a (batch of) square matrices and ``B`` (operand 1)
    a vector or a (batch of) matrices with as many rows."""
    _check_square(avals, attrs)
    n, b = avals[0].shape[-1], list(avals[1].shape)
    if not b or b[-2 if len(b) > 1 else -1] != n:
        raise ValueError(
            f"B (operand 1) must be a vector of size {n} or a (batch of) matrices with "
            f"{n} rows, to match A {list(avals[0].shape)}; found shape {b}"
        )


class CholeskyAttrs(Attrs):
    """The attributes of ``cholesky``."""

    upper: bool = False


@register_op("cholesky", attrs=CholeskyAttrs, check=_check_square)
@_on_cpu
def cholesky(operands, attrs):
    """Cholesky factor of a symmetric positive definite matrix: lower ``L`` with
    ``A = L @ L.T`` (upper ``U`` with ``A = U.T @ U`` when ``upper``). Only the
    selected triangle of ``A`` is read. NaN for a matrix that is not
    (numerically) positive definite or has a non-finite entry in that
    triangle."""
    a = operands[0]
    if a.size == 0:
        # LAPACK is not called on an empty batch or 0x0 matrices (a
        # [2, 0, 0] operand hung it): the factor is as empty as the operand.
        return mx.zeros_like(a)
    ok = _finite(a, "U" if attrs.upper else "L")
    factor = mx.linalg.cholesky(mx.where(ok, a, 0), upper=attrs.upper)
    # LAPACK stops at the first pivot that is not positive and leaves it on
    # the diagonal (MLX ignores the failure code): a factor is complete
    # exactly when its whole diagonal is positive.
    positive = mx.all(mx.diagonal(factor, axis1=-2, axis2=-1) > 0, axis=-1)
    return _contiguous(_nan_unless(mx.logical_and(ok, positive[..., None, None]), factor))


@register_op("solve", operands=2, check=_check_solve)
@_on_cpu
def solve(operands, attrs):
    """Solve ``A @ X = B`` for ``X`` (operands ``A``, ``B``); ``B`` is a vector or
    a (batch of) matrices of right-hand sides, and batch axes broadcast. NaN
    for a singular ``A`` (a zero pivot) or one with a non-finite entry;
    non-finite values in ``B`` propagate as in any arithmetic."""
    a, b = operands
    if a.size == 0 or b.size == 0:
        return _empty_solution(a, b)
    ok = _finite(a)
    pivots, lower, upper = _lu(mx.where(ok, a, 0))
    # As mx.linalg.solve: B's rows in pivot order, then two triangular
    # solves; B as a matrix of right-hand sides with A's batch axes.
    rhs = b[:, None] if b.ndim == 1 else b
    shape = [*mx.broadcast_shapes(a.shape[:-2], rhs.shape[:-2]), *rhs.shape[-2:]]
    rows = mx.broadcast_to(mx.argsort(pivots, axis=-1)[..., None], [*shape[:-1], 1])
    y = mx.linalg.solve_triangular(
        lower, mx.take_along_axis(mx.broadcast_to(rhs, shape), rows, axis=-2))
    regular, safe_upper = _invertible_triangular(upper, upper=True)
    x = mx.linalg.solve_triangular(safe_upper, y, upper=True)
    x = _nan_unless(mx.logical_and(ok, regular), x)
    return _contiguous(x[..., 0] if b.ndim == 1 else x)


class SolveTriangularAttrs(Attrs):
    """The attributes of ``solve_triangular``."""

    upper: bool = False


@register_op("solve_triangular", attrs=SolveTriangularAttrs, operands=2, check=_check_solve)
@_on_cpu
def solve_triangular(operands, attrs):
    """Solve ``A @ X = B`` for triangular ``A`` (operands ``A``, ``B``); only the
    lower (or, with ``upper``, the upper) triangle of ``A`` is read. NaN for
    an ``A`` with a zero on the diagonal (singular) or a non-finite entry in
    that triangle; non-finite values in ``B`` propagate as in any
    arithmetic."""
    a, b = operands
    if a.size == 0 or b.size == 0:
        return _empty_solution(a, b)
    ok, a = _invertible_triangular(a, attrs.upper)
    x = mx.linalg.solve_triangular(a, b, upper=attrs.upper)
    return _contiguous(_nan_unless(ok, x, 2 if b.ndim > 1 else 1))


@register_op("inv", check=_check_square)
@_on_cpu
def inv(operands, attrs):
    """Inverse of a square matrix. NaN for a singular matrix (a zero pivot) or
    one with a non-finite entry."""
    a = operands[0]
    if a.size == 0:
        return mx.zeros_like(a)
    ok = _finite(a)
    pivots, lower, upper = _lu(mx.where(ok, a, 0))
    regular, safe_upper = _invertible_triangular(upper, upper=True)
    # A = L[pivots] @ U, so inv(A) = inv(U) @ inv(L) with its columns in
    # pivot order: column i of inv(A) is column pivots[i] of the product.
    x = mx.linalg.tri_inv(safe_upper, upper=True) @ mx.linalg.tri_inv(lower, upper=False)
    x = mx.take_along_axis(x, mx.expand_dims(pivots, -2), axis=-1)
    return _contiguous(_nan_unless(mx.logical_and(ok, regular), x))


@register_op("pinv")
@_on_cpu
def pinv(operands, attrs):
    """Moore-Penrose pseudo-inverse (via SVD); an ``(M, N)`` matrix gives
    ``(N, M)``. NaN for a matrix with a non-finite entry."""
    a = operands[0]
    if a.size == 0:
        return mx.zeros([*a.shape[:-2], a.shape[-1], a.shape[-2]], a.dtype)
    ok = _finite(a)
    return _contiguous(_nan_unless(ok, mx.linalg.pinv(mx.where(ok, a, 0))))


_ORD_SCHEMA = {"anyOf": [{"type": "number"}, {"enum": ["inf", "-inf", "fro", "nuc"]},
                         {"type": "null"}]}
_AXIS_SCHEMA = {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer"}},
                          {"type": "null"}]}


class NormAttrs(Attrs):
    """The attributes of ``norm``."""

    ord: Annotated[float | Literal["fro", "nuc"] | None, WithJsonSchema(_ORD_SCHEMA)] = None
    # An int or one axis: vector norms; two axes: matrix norms.
    axis: Annotated[Axes | None, WithJsonSchema(_AXIS_SCHEMA)] = None
    keepdims: bool = False

    @field_validator("ord", mode="before")
    @classmethod
    def _ord(cls, value):
        if isinstance(value, str) and value not in ("fro", "nuc"):
            if value not in ("inf", "-inf"):
                raise ValueError(
                    f'ord is a number, "inf", "-inf", "fro" or "nuc"; found {value!r}'
                )
            return float(value)
        return value

    @field_validator("axis", mode="before")
    @classmethod
    def _axis(cls, value):
        return [value] if isinstance(value, int) else value


def _uses_svd(attrs: NormAttrs, ndim: int) -> bool:
    """Whether ``norm`` of an operand of rank ``ndim`` needs singular values."""
    if attrs.ord not in (2, -2, "nuc"):
        return False
    return ndim == 2 if attrs.axis is None else len(attrs.axis) == 2


@_on_cpu
def _svd_norm(operands, attrs: NormAttrs) -> mx.array:
    """A matrix norm from singular values, NaN for a matrix with a non-finite
    entry."""
    x = operands[0]
    axes = attrs.axis or [0, 1]
    ok = mx.all(mx.isfinite(x), axis=axes, keepdims=True)
    value = mx.linalg.norm(mx.where(ok, x, 0), ord=attrs.ord, axis=attrs.axis,
                           keepdims=attrs.keepdims)
    return mx.where(ok if attrs.keepdims else mx.squeeze(ok, axes), value, math.nan)


@register_op("norm", attrs=NormAttrs)
def norm(operands, attrs):
    """Vector or matrix norm, as ``mx.linalg.norm``. ``ord`` is a JSON number
    (not a boolean), ``"inf"``, ``"-inf"``, ``"fro"``, ``"nuc"`` or null; other
    strings and types are rejected. Vector norms take any number: 0 counts
    the nonzero entries, ``"inf"``/``"-inf"`` give the largest/smallest
    magnitude, any other ``p`` gives ``sum(|x|**p)**(1/p)``.
    Matrix norms take 1, -1, 2, -2, ``"inf"``, ``"-inf"``, ``"fro"`` and
    ``"nuc"``; other values are rejected at validation. null gives the 2-norm
    of a vector and the Frobenius norm of a matrix. Without ``axis``, a 1-D
    operand gives a vector norm, a 2-D one a matrix norm, and ``ord=null`` the
    2-norm of the flattened operand. The norms from singular values (``ord``
    2, -2, ``"nuc"`` of matrices) run on the CPU and are NaN for a matrix with
    a non-finite entry; the others propagate inf and NaN as in any
    arithmetic."""
    if _uses_svd(attrs, operands[0].ndim):
        return _svd_norm(operands, attrs)
    return mx.linalg.norm(operands[0], ord=attrs.ord, axis=attrs.axis, keepdims=attrs.keepdims)


@register_op("qr", outputs=2)
@_on_cpu
def qr(operands, attrs):
    """Reduced QR factorization: results ``Q`` (orthonormal columns, ``(M, K)``)
    and upper-triangular ``R`` (``(K, N)``), ``K = min(M, N)``, with
    ``A = Q @ R``. NaN for a matrix with a non-finite entry."""
    a = operands[0]
    if a.size == 0:
        *batch, m, n = a.shape
        k = min(m, n)
        return mx.zeros([*batch, m, k], a.dtype), mx.zeros([*batch, k, n], a.dtype)
    ok = _finite(a)
    return _contiguous(*(_nan_unless(ok, x) for x in mx.linalg.qr(mx.where(ok, a, 0))))


class EighAttrs(Attrs):
    """The attributes of ``eigh``."""

    UPLO: Literal["L", "U"] = "L"  # the triangle of A that is read


@register_op("eigh", attrs=EighAttrs, outputs=2, check=_check_square)
@_on_cpu
def eigh(operands, attrs):
    """Eigendecomposition of a symmetric matrix: results ``eigenvalues``
    (ascending) and ``eigenvectors`` (columns), with ``A @ v = w * v``. Only
    the ``UPLO`` triangle is read; NaN for a matrix with a non-finite entry
    there."""
    a = operands[0]
    if a.size == 0:
        return mx.zeros(a.shape[:-1], a.dtype), mx.zeros_like(a)
    ok = _finite(a, attrs.UPLO)
    values, vectors = mx.linalg.eigh(mx.where(ok, a, 0), UPLO=attrs.UPLO)
    return _contiguous(_nan_unless(ok, values, 1), _nan_unless(ok, vectors))


@register_op("svd", outputs=3)
@_on_cpu
def svd(operands, attrs):
    """Full singular value decomposition: results ``U`` (``(M, M)``), ``S``
    (``(K,)``, descending, ``K = min(M, N)``) and ``Vt`` (``(N, N)``), with
    ``A = U[:, :K] @ diag(S) @ Vt[:K]``. NaN for a matrix with a non-finite
    entry."""
    a = operands[0]
    if a.size == 0:
        # Of an (M, 0) or (0, N) matrix every singular vector is free: the
        # identity (as numpy gives); an empty batch has no matrices at all.
        *batch, m, n = a.shape
        return _contiguous(_identity(a, m), mx.zeros([*batch, min(m, n)], a.dtype),
                           _identity(a, n))
    ok = _finite(a)
    u, s, vt = mx.linalg.svd(mx.where(ok, a, 0), compute_uv=True)
    return _contiguous(_nan_unless(ok, u), _nan_unless(ok, s, 1), _nan_unless(ok, vt))


@register_op("lu", outputs=3)
@_on_cpu
def lu(operands, attrs):
    """LU factorization with partial pivoting: results ``pivots`` (``uint32`` row
    indices, ``(M,)``), unit lower-triangular ``L`` (``(M, K)``) and
    upper-triangular ``U`` (``(K, N)``), ``K = min(M, N)``, with
    ``A = L[pivots] @ U`` (as ``mx.linalg.lu``: pivots index rows of ``L``).
    A singular matrix factors as any other (``U`` has a zero pivot). For a
    matrix with a non-finite entry, ``L`` and ``U`` are NaN and ``pivots``
    the identity permutation."""
    a = operands[0]
    if a.size == 0:
        return _contiguous(*_lu(a))
    ok = _finite(a)
    pivots, lower, upper = _lu(mx.where(ok, a, 0))
    identity = mx.arange(a.shape[-2], dtype=mx.uint32)
    pivots = mx.where(mx.squeeze(ok, -1), pivots, identity)
    return _contiguous(pivots, _nan_unless(ok, lower), _nan_unless(ok, upper))
