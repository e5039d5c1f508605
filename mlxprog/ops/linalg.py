"""Linear algebra, as ``mx.linalg``: factorizations (``cholesky``, ``qr``,
``eigh``, ``svd``, ``lu``), solves, inverses and norms. MLX implements its
factorizations and solves only on the CPU, so these ops run on the CPU stream
and return contiguous arrays: they compose inside compiled programs whatever
the default device. Matrices are the last two axes; leading axes are batch
axes. Inputs must be ``float32`` or ``float64``.
"""

from __future__ import annotations

from typing import Annotated, Literal

import mlx.core as mx
from pydantic import WithJsonSchema, field_validator

from ..arrays import AVal
from .attrs import Attrs, Axes
from .registry import register_op


def _contiguous(*arrays: mx.array) -> mx.array | tuple[mx.array, ...]:
    """Contiguous copies (on the CPU stream) of linalg results, which MLX may
    return as strided views."""
    out = tuple(mx.contiguous(a, stream=mx.cpu) for a in arrays)
    return out[0] if len(out) == 1 else out


def _check_square(avals: list[AVal], attrs) -> None:
    """Operand 0 is a (batch of) square matrices."""
    shape = list(avals[0].shape)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ValueError(
            f"operand 0 must be a square matrix (or a batch of them in the last "
            f"two axes); found shape {shape}"
        )


class CholeskyAttrs(Attrs):
    """The attributes of ``cholesky``."""

    upper: bool = False


@register_op("cholesky", attrs=CholeskyAttrs, check=_check_square)
def cholesky(operands, attrs):
    """Cholesky factor of a symmetric positive definite matrix: lower ``L`` with
    ``A = L @ L.T`` (upper ``U`` with ``A = U.T @ U`` when ``upper``). Only the
    selected triangle of ``A`` is read."""
    return _contiguous(mx.linalg.cholesky(operands[0], upper=attrs.upper, stream=mx.cpu))


@register_op("solve", operands=2)
def solve(operands, attrs):
    """Solve ``A @ X = B`` for ``X`` (operands ``A``, ``B``); ``B`` is a vector or
    a matrix of right-hand sides."""
    a, b = operands
    return _contiguous(mx.linalg.solve(a, b, stream=mx.cpu))


class SolveTriangularAttrs(Attrs):
    """The attributes of ``solve_triangular``."""

    upper: bool = False


@register_op("solve_triangular", attrs=SolveTriangularAttrs, operands=2)
def solve_triangular(operands, attrs):
    """Solve ``A @ X = B`` for triangular ``A`` (operands ``A``, ``B``); only the
    lower (or, with ``upper``, the upper) triangle of ``A`` is read."""
    a, b = operands
    return _contiguous(mx.linalg.solve_triangular(a, b, upper=attrs.upper, stream=mx.cpu))


@register_op("inv", check=_check_square)
def inv(operands, attrs):
    """Inverse of a square matrix."""
    return _contiguous(mx.linalg.inv(operands[0], stream=mx.cpu))


@register_op("pinv")
def pinv(operands, attrs):
    """Moore-Penrose pseudo-inverse (via SVD); an ``(M, N)`` matrix gives ``(N, M)``."""
    return _contiguous(mx.linalg.pinv(operands[0], stream=mx.cpu))


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


@register_op("norm", attrs=NormAttrs)
def norm(operands, attrs):
    """Vector or matrix norm, as ``mx.linalg.norm``: ``ord`` is a number,
    ``"fro"`` or ``"nuc"`` (None: 2-norm / Frobenius). Without ``axis``, a 1-D
    operand gives a vector norm, a 2-D one a matrix norm, and ``ord=None`` the
    2-norm of the flattened operand. Matrix norms that need singular values
    (``ord`` 2, -2, ``"nuc"``) run on the CPU."""
    x = operands[0]
    stream = mx.cpu if _uses_svd(attrs, x.ndim) else None
    return mx.linalg.norm(x, ord=attrs.ord, axis=attrs.axis, keepdims=attrs.keepdims,
                          stream=stream)


@register_op("qr", outputs=2)
def qr(operands, attrs):
    """Reduced QR factorization: results ``Q`` (orthonormal columns, ``(M, K)``)
    and upper-triangular ``R`` (``(K, N)``), ``K = min(M, N)``, with ``A = Q @ R``."""
    return _contiguous(*mx.linalg.qr(operands[0], stream=mx.cpu))


class EighAttrs(Attrs):
    """The attributes of ``eigh``."""

    UPLO: Literal["L", "U"] = "L"  # the triangle of A that is read


@register_op("eigh", attrs=EighAttrs, outputs=2, check=_check_square)
def eigh(operands, attrs):
    """Eigendecomposition of a symmetric matrix: results ``eigenvalues``
    (ascending) and ``eigenvectors`` (columns), with ``A @ v = w * v``."""
    return _contiguous(*mx.linalg.eigh(operands[0], UPLO=attrs.UPLO, stream=mx.cpu))


@register_op("svd", outputs=3)
def svd(operands, attrs):
    """Full singular value decomposition: results ``U`` (``(M, M)``), ``S``
    (``(K,)``, descending, ``K = min(M, N)``) and ``Vt`` (``(N, N)``), with
    ``A = U[:, :K] @ diag(S) @ Vt[:K]``."""
    return _contiguous(*mx.linalg.svd(operands[0], compute_uv=True, stream=mx.cpu))


@register_op("lu", outputs=3)
def lu(operands, attrs):
    """LU factorization with partial pivoting: results ``pivots`` (``uint32`` row
    indices, ``(M,)``), unit lower-triangular ``L`` (``(M, K)``) and
    upper-triangular ``U`` (``(K, N)``), ``K = min(M, N)``, with
    ``A = L[pivots] @ U`` (as ``mx.linalg.lu``: pivots index rows of ``L``)."""
    return _contiguous(*mx.linalg.lu(operands[0], stream=mx.cpu))
