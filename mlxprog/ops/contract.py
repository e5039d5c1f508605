"""Contractions: XLA-style ``dot`` (dot_general), ``matmul``, ``tensordot`` and
``einsum``.

MLX multiplies matrices only in floating dtypes. ``dot``, ``tensordot`` and
``matmul`` also accept integer and bool operands, computed exactly (integers
wrap on overflow as in XLA; bool gives "or of ands") on the CPU: with native
kernels on, integer products run mlxprog's exact integer GEMM (wrapping
unsigned arithmetic of the result's width); otherwise they are ``float64``
matrix products of 11-bit pieces of the operands: memory stays proportional
to the operands and the result, and the time is several float products (3 for
16-bit, 6 for 32-bit, 21 for 64-bit results).

Only ``matmul`` is shapeless: ``dot`` and ``tensordot`` fold axes together with
reshapes to sizes fixed at trace time, and ``einsum`` may.

With native kernels on (:mod:`mlxprog.native`), float32 products of ``matmul``,
``dot`` and ``tensordot`` run mlxprog's own GEMM on the CPU (MLX's CPU matmul,
where it links a reference BLAS, is an order of magnitude slower); results
differ from MLX's only in float32 summation order. ``einsum`` stays MLX's.
"""

from __future__ import annotations

import math
from typing import Annotated

import mlx.core as mx
from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from ..arrays import AVal
from ..native import Setting
from ..native import kernels as native
from .attrs import Attrs, AxisOf, CheckError, normalize_axis
from .registry import register_op


def _check_count(lhs_axes, rhs_axes, kind: str) -> None:
    """Raise unless lhs and rhs name the same number of ``kind`` axes."""
    if len(lhs_axes) != len(rhs_axes):
        raise ValueError(
            f"lhs has {len(lhs_axes)} {kind} axes {list(lhs_axes)} but rhs has "
            f"{len(rhs_axes)} {list(rhs_axes)}; they are paired one to one"
        )


def _check_sizes(avals: list[AVal], lhs_axes, rhs_axes, kind: str) -> None:
    """Raise unless paired (normalised) lhs and rhs axes have equal sizes."""
    lhs_shape, rhs_shape = avals[0].shape, avals[1].shape
    for a, b in zip(lhs_axes, rhs_axes):
        if lhs_shape[a] != rhs_shape[b]:
            raise ValueError(
                f"{kind} axes pair lhs axis {a} (size {lhs_shape[a]}) with rhs axis {b} "
                f"(size {rhs_shape[b]}); paired axes must have equal sizes"
            )


_PIECE_BITS = 11
"""Integer operands are multiplied in pieces of this many bits: a product of
two pieces is below 2**22, so ``float64`` sums of up to 2**31 of them (more
terms than any axis holds) are exact."""


def _matmul(a: mx.array, b: mx.array, setting: Setting, op: str = "matmul") -> mx.array:
    """``mx.matmul``, extended exactly to integer and bool operands; float32
    products take the native kernel where ``setting`` allows it (counted for
    the calling ``op``)."""
    if mx.issubdtype(a.dtype, mx.inexact) or mx.issubdtype(b.dtype, mx.inexact):
        out = native.matmul(setting, a, b, op=op)
        return out if out is not None else mx.matmul(a, b)
    dtype = mx.result_type(a.dtype, b.dtype)
    if dtype == mx.bool_:
        # A float sum of ones and zeros is positive exactly when a term is.
        return mx.matmul(a.astype(mx.float32), b.astype(mx.float32)) > 0
    if mx.issubdtype(dtype, mx.inexact):  # int64 with uint64 promotes to float32
        return mx.matmul(a.astype(dtype), b.astype(dtype))
    with mx.stream(mx.cpu):  # the GPU has no float64 (nor the native kernel)
        out = native.integer_matmul(setting, a, b, op=op)
        return out if out is not None else _integer_matmul(a, b, dtype)


def _integer_matmul(a: mx.array, b: mx.array, dtype: mx.Dtype) -> mx.array:
    """The product in ``dtype`` modulo ``2**bits``, as a sum of the products
    of the operands' pieces shifted into place: only the low ``bits`` bits of
    each operand (its two's complement) and the pairs of pieces that land
    below bit ``bits`` can change the result."""
    bits = dtype.size * 8

    def pieces(x: mx.array) -> list[mx.array]:
        x = x.astype(mx.uint64)  # sign-extended: the same low bits
        mask = (1 << _PIECE_BITS) - 1
        return [((x >> shift) & mask).astype(mx.float64)
                for shift in range(0, bits, _PIECE_BITS)]

    terms = [
        mx.matmul(pa, pb).astype(mx.uint64) << _PIECE_BITS * (i + j)
        for i, pa in enumerate(pieces(a))
        for j, pb in enumerate(pieces(b))
        if _PIECE_BITS * (i + j) < bits
    ]
    # uint64 sums and shifts wrap modulo 2**64; the cast keeps the low bits.
    return sum(terms[1:], terms[0]).astype(dtype)


def _dot_general(lhs: mx.array, rhs: mx.array, setting: Setting, op: str, lhs_contracting,
                 rhs_contracting, lhs_batch=(), rhs_batch=()) -> mx.array:
    """Contract validated axis lists: transpose each side to (batch, free,
    contracting) order, fold into one batched matrix product (``setting``
    and ``op``: whether it may take the native kernel, counted for which op),
    unfold the result into batch axes, then lhs free axes, then rhs free
    axes."""
    lhs_free = [a for a in range(lhs.ndim) if a not in lhs_contracting and a not in lhs_batch]
    rhs_free = [a for a in range(rhs.ndim) if a not in rhs_contracting and a not in rhs_batch]
    batch_shape = [lhs.shape[a] for a in lhs_batch]
    lhs_free_shape = [lhs.shape[a] for a in lhs_free]
    rhs_free_shape = [rhs.shape[a] for a in rhs_free]
    batch = math.prod(batch_shape)
    depth = math.prod(lhs.shape[a] for a in lhs_contracting)
    lhs3 = mx.reshape(mx.transpose(lhs, [*lhs_batch, *lhs_free, *lhs_contracting]),
                      [batch, math.prod(lhs_free_shape), depth])
    rhs3 = mx.reshape(mx.transpose(rhs, [*rhs_batch, *rhs_contracting, *rhs_free]),
                      [batch, depth, math.prod(rhs_free_shape)])
    # mx.reshape rather than array.reshape(*shape), which crashes MLX 0.32 when
    # the shape is empty.
    return mx.reshape(_matmul(lhs3, rhs3, setting, op),
                      [*batch_shape, *lhs_free_shape, *rhs_free_shape])


def _folded_covered(lhs: AVal, rhs: AVal, lhs_contracting, lhs_batch=()) -> bool:
    """Whether a native matmul covers ``_dot_general``'s folded product of
    these operands (validated axes): the folded shapes always pair up, so
    this is whether a native kernel takes their dtypes."""
    batch = math.prod(lhs.shape[a] for a in lhs_batch)
    depth = math.prod(lhs.shape[a] for a in lhs_contracting)
    return _matmul_covered(AVal((batch, 1, depth), lhs.dtype), AVal((batch, depth, 1), rhs.dtype))


def _matmul_covered(a: AVal, b: AVal) -> bool:
    """Whether a native kernel (the float32 or the exact integer one)
    computes ``_matmul(a, b)``."""
    return native.covers_matmul(a, b) or native.covers_integer_matmul(a, b)


LhsAxes = Annotated[list[int], AxisOf(many=True, operand=0, what="lhs axis")]
"""Distinct axes of the lhs (operand 0)."""

RhsAxes = Annotated[list[int], AxisOf(many=True, operand=1, what="rhs axis")]
"""Distinct axes of the rhs (operand 1)."""


class DotAttrs(Attrs):
    # Defaults are validated too, so an rhs list left out is still paired.
    model_config = ConfigDict(validate_default=True)

    lhs_contracting_axes: LhsAxes = []
    """Axes of lhs summed over, paired in order with ``rhs_contracting_axes``."""
    rhs_contracting_axes: RhsAxes = []
    """Axes of rhs summed over."""
    lhs_batch_axes: LhsAxes = []
    """Axes of lhs mapped over, paired in order with ``rhs_batch_axes``."""
    rhs_batch_axes: RhsAxes = []
    """Axes of rhs mapped over."""

    @field_validator("rhs_contracting_axes", "rhs_batch_axes")
    @classmethod
    def _paired(cls, axes: list[int], info: ValidationInfo) -> list[int]:
        kind = info.field_name.split("_")[1]
        if f"lhs_{kind}_axes" in info.data:
            _check_count(info.data[f"lhs_{kind}_axes"], axes, kind)
        return axes


def _check_dot(avals: list[AVal], attrs: DotAttrs) -> None:
    """No axis is both a batch and a contracting axis, and paired axes have
    equal sizes."""
    for side in ("lhs", "rhs"):
        both = sorted(set(getattr(attrs, f"{side}_batch_axes"))
                      & set(getattr(attrs, f"{side}_contracting_axes")))
        if both:
            raise CheckError(f"{side} axes {both} are both batch and contracting axes",
                             attribute=f"{side}_batch_axes")
    for kind in ("contracting", "batch"):
        try:
            _check_sizes(avals, getattr(attrs, f"lhs_{kind}_axes"),
                         getattr(attrs, f"rhs_{kind}_axes"), kind)
        except ValueError as exc:
            raise CheckError(str(exc), attribute=f"rhs_{kind}_axes") from None


@register_op("dot", attrs=DotAttrs, operands=2, check=_check_dot, context=True,
             native_coverage=lambda avals, attrs: _folded_covered(
                 *avals, attrs.lhs_contracting_axes, attrs.lhs_batch_axes))
def dot(operands, attrs, context):
    """XLA ``dot_general`` (operands: lhs, rhs). Sums products over the paired
    ``lhs_contracting_axes``/``rhs_contracting_axes`` and maps over the paired
    ``lhs_batch_axes``/``rhs_batch_axes``; paired axes must have equal sizes. The
    result's axes are the batch axes, then lhs's remaining axes, then rhs's, each
    in operand order. Negative axes count from the end. Dtypes promote like
    MLX; integer and bool operands are computed exactly (integers wrap on
    overflow; bool gives "or of ands") on the CPU (see the module docstring)."""
    lhs, rhs = operands
    return _dot_general(lhs, rhs, context.native, "dot", attrs.lhs_contracting_axes,
                        attrs.rhs_contracting_axes, attrs.lhs_batch_axes, attrs.rhs_batch_axes)


@register_op("matmul", operands=2, shapeless=True, context=True,
             native_coverage=lambda avals, attrs: _matmul_covered(*avals))
def matmul(operands, attrs, context):
    """Matrix product with numpy ``matmul`` rules (operands: a, b): 1-D operands
    act as a row/column vector, leading batch axes broadcast. Integer and bool
    operands are computed exactly, as for ``dot``."""
    return _matmul(*operands, context.native)


class TensordotAttrs(Attrs):
    axes: int | tuple[list[int], list[int]] = 2
    """n: contract a's last n axes with b's first n; or ``[a_axes, b_axes]``,
    paired in order."""

    @field_validator("axes")
    @classmethod
    def _counts(cls, axes):
        if isinstance(axes, int):
            if axes < 0:
                raise ValueError(f"cannot contract a negative number ({axes}) of axes")
        else:
            _check_count(*axes, "contracting")
        return axes


def _tensordot_axes(attrs: TensordotAttrs, lhs_ndim: int,
                    rhs_ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The contracted axes of a and b, non-negative, from ``axes`` as a count
    or as lists. ValueError for a count above either rank or for an axis out
    of range or named twice."""
    if isinstance(attrs.axes, int):
        n = attrs.axes
        if n > min(lhs_ndim, rhs_ndim):
            raise ValueError(
                f"cannot contract {n} axes of operands of rank {lhs_ndim} and {rhs_ndim}"
            )
        return tuple(range(lhs_ndim - n, lhs_ndim)), tuple(range(n))
    lhs_axes, rhs_axes = attrs.axes
    return _operand_axes(lhs_axes, lhs_ndim, "lhs"), _operand_axes(rhs_axes, rhs_ndim, "rhs")


def _operand_axes(axes: list[int], ndim: int, side: str) -> tuple[int, ...]:
    """``axes`` of the ``side`` operand normalised to non-negative, each named once."""
    normalized = tuple(normalize_axis(a, ndim, f"{side} axis") for a in axes)
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"{side} axes {axes} name an axis twice")
    return normalized


def _check_tensordot(avals: list[AVal], attrs: TensordotAttrs) -> None:
    """The contracted axes exist and pair axes of equal sizes."""
    try:
        lhs_axes, rhs_axes = _tensordot_axes(attrs, len(avals[0].shape), len(avals[1].shape))
        _check_sizes(avals, lhs_axes, rhs_axes, "contracting")
    except ValueError as exc:
        raise CheckError(str(exc), attribute="axes") from None


def _tensordot_covered(avals: list[AVal], attrs: TensordotAttrs) -> bool:
    """Whether the native matmul covers this tensordot's folded product."""
    lhs, rhs = avals
    lhs_axes, _ = _tensordot_axes(attrs, len(lhs.shape), len(rhs.shape))
    return _folded_covered(lhs, rhs, lhs_axes)


@register_op("tensordot", attrs=TensordotAttrs, operands=2, check=_check_tensordot,
             context=True, native_coverage=_tensordot_covered)
def tensordot(operands, attrs, context):
    """Tensor contraction (operands: a, b). ``axes`` is an int n (contract a's
    last n axes with b's first n) or two lists of axes paired one to one. The
    result's axes are a's remaining axes, then b's. Integer and bool operands are
    computed exactly, as for ``dot``."""
    lhs, rhs = operands
    return _dot_general(lhs, rhs, context.native, "tensordot",
                        *_tensordot_axes(attrs, lhs.ndim, rhs.ndim))


class EinsumAttrs(Attrs):
    subscripts: str = Field(min_length=1)
    """Einstein summation subscripts, e.g. ``"ij,jk->ik"``."""


@register_op("einsum", attrs=EinsumAttrs, operands=(1, None))
def einsum(operands, attrs):
    """Einstein summation (``mx.einsum``) over the operands, e.g.
    ``"bij,bjk->bik"``. Floating dtypes only, as in MLX."""
    return mx.einsum(attrs.subscripts, *operands)
