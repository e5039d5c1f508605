"""Quantization, as ``mx.quantize``: packing weights, unpacking them, matmuls
on packed weights, and the gathered (mixture-of-experts) matmuls. A quantized
matrix is a packed ``uint32`` weight plus per-group ``scales`` and, in
``"affine"`` mode only, ``biases`` (see ``quantize`` for the modes). Which
operands an op takes follows from its attributes: ``mode`` decides whether
``biases`` is present, ``lhs_indices``/``rhs_indices`` whether the index
operands are; each op's entry lists them in order.
"""

from __future__ import annotations

from typing import Literal

import mlx.core as mx
from pydantic import model_validator

from ..arrays import AVal, to_mlx
from ..native import kernels as native
from .attrs import Attrs, DType
from .registry import register_op

Mode = Literal["affine", "mxfp4", "mxfp8", "nvfp4"]

# mode: (group sizes, bits) that MLX supports.
_SUPPORTED: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "affine": ((32, 64, 128), (1, 2, 3, 4, 5, 6, 8)),
    "mxfp4": ((32,), (4,)),
    "mxfp8": ((32,), (8,)),
    "nvfp4": ((16,), (4,)),
}


class OperandsAttrs(Attrs):
    """Attributes that decide which operands an op takes: ``operand_names()``
    lists them in order, and the ops' check (``_check_operands``) requires
    exactly those."""

    def operand_names(self) -> tuple[str, ...]:
        """The names of the operands these attributes call for, in order."""
        raise NotImplementedError


def _check_operands(avals: list[AVal], attrs: OperandsAttrs) -> None:
    """The instruction gives exactly the operands its attributes call for."""
    names = attrs.operand_names()
    if len(avals) != len(names):
        raise ValueError(
            f"with these attributes the operands are ({', '.join(names)}): "
            f"{len(names)} expected, found {len(avals)}"
        )


class QuantAttrs(OperandsAttrs):
    """The attributes of ``quantize``, which every quantized-matrix op takes."""

    group_size: int | None = None  # None: the mode's default
    bits: int | None = None  # None: the mode's default
    mode: Mode = "affine"

    @model_validator(mode="after")
    def _check_mode(self):
        sizes, bits = _SUPPORTED[self.mode]
        for name, value, allowed in (("group_size", self.group_size, sizes),
                                     ("bits", self.bits, bits)):
            if value is not None and value not in allowed:
                raise ValueError(
                    f"mode {self.mode!r} supports {name} "
                    f"{', '.join(map(str, allowed))}; found {value}"
                )
        return self

    def parts(self) -> tuple[str, ...]:
        """The arrays of a quantized matrix in this mode."""
        return ("w", "scales", "biases") if self.mode == "affine" else ("w", "scales")

    def operand_names(self) -> tuple[str, ...]:
        return ("w",)

    def quant_kwargs(self) -> dict:
        """Keyword arguments shared by the ``mx`` quantization functions."""
        return {"group_size": self.group_size, "bits": self.bits, "mode": self.mode}

    def resolved(self) -> tuple[int, int]:
        """(group_size, bits) with the mode's defaults filled in."""
        sizes, bits = _SUPPORTED[self.mode]
        default_bits = 4 if self.mode == "affine" else bits[0]
        default_size = 64 if self.mode == "affine" else sizes[0]
        return self.group_size or default_size, self.bits or default_bits


@register_op("quantize", attrs=QuantAttrs, outputs=lambda attrs, n: len(attrs.parts()),
             check=_check_operands)
def quantize(operands, attrs):
    """Quantize ``w`` (rank >= 2, floating, last axis divisible by
    ``group_size``) in groups along its last axis. Results: packed ``w``
    (``uint32``), ``scales`` and, in ``"affine"`` mode, ``biases``.

    The modes, with the group sizes and bits MLX supports (null: the first):

    | mode | group_size | bits | biases |
    | --- | --- | --- | --- |
    | ``affine`` | 64, 32, 128 | 4, 1, 2, 3, 5, 6, 8 | yes |
    | ``mxfp4`` | 32 | 4 | no |
    | ``mxfp8`` | 32 | 8 | no |
    | ``nvfp4`` | 16 | 4 | no |
    """
    return tuple(mx.quantize(operands[0], **attrs.quant_kwargs()))


class DequantizeAttrs(QuantAttrs):
    """The attributes of ``dequantize``."""

    dtype: DType | None = None

    def operand_names(self) -> tuple[str, ...]:
        return self.parts()


@register_op("dequantize", attrs=DequantizeAttrs, operands=(2, 3), check=_check_operands)
def dequantize(operands, attrs):
    """Unpack a quantized matrix back to floats of ``dtype`` (null: the scales'
    dtype in ``"affine"`` mode, else ``bfloat16``). Operands: ``w``, ``scales``,
    and ``biases`` in ``"affine"`` mode."""
    named = dict(zip(attrs.operand_names(), operands))
    dtype = None if attrs.dtype is None else to_mlx(attrs.dtype)
    return mx.dequantize(named["w"], named["scales"], named.get("biases"), dtype=dtype,
                         **attrs.quant_kwargs())


class QuantizedMatmulAttrs(QuantAttrs):
    """The attributes of ``quantized_matmul``."""

    transpose: bool = True  # x @ w.T (w stored as (out, in)); False: x @ w

    def operand_names(self) -> tuple[str, ...]:
        return ("x", *self.parts())


def _native_quantized_matmul(avals, attrs) -> bool:
    """Whether the native quantized-matmul kernel computes this instruction."""
    named = dict(zip(attrs.operand_names(), avals))
    group_size, bits = attrs.resolved()
    return native.covers_quantized_matmul(named["x"], named["w"], named["scales"],
                                          named.get("biases"), attrs.transpose, group_size,
                                          bits, attrs.mode)


@register_op("quantized_matmul", attrs=QuantizedMatmulAttrs, operands=(3, 4),
             check=_check_operands, native_coverage=_native_quantized_matmul)
def quantized_matmul(operands, attrs):
    """``x @ dequantize(w).T`` (or ``x @ dequantize(w)`` without ``transpose``),
    computed on the packed weight. Operands: ``x``, ``w``, ``scales``, and
    ``biases`` in ``"affine"`` mode."""
    named = dict(zip(attrs.operand_names(), operands))
    x, w, scales, biases = named["x"], named["w"], named["scales"], named.get("biases")
    group_size, bits = attrs.resolved()
    result = native.quantized_matmul(x, w, scales, biases, transpose=attrs.transpose,
                                     mode=attrs.mode, group_size=group_size, bits=bits)
    if result is not None:
        return result
    return mx.quantized_matmul(x, w, scales, biases, transpose=attrs.transpose,
                               **attrs.quant_kwargs())


class GatherAttrs(Attrs):
    """Which index operands a gathered matmul takes (each absent one: every
    batch entry in order, as MLX's ``None``)."""

    lhs_indices: bool = False
    rhs_indices: bool = False
    sorted_indices: bool = False  # a hint: the indices are sorted

    def index_names(self) -> tuple[str, ...]:
        return tuple(name for name in ("lhs_indices", "rhs_indices") if getattr(self, name))


class GatherQMMAttrs(QuantizedMatmulAttrs, GatherAttrs):
    """The attributes of ``gather_qmm``."""

    def operand_names(self) -> tuple[str, ...]:
        return (*super().operand_names(), *self.index_names())


@register_op("gather_qmm", attrs=GatherQMMAttrs, operands=(3, 6), check=_check_operands)
def gather_qmm(operands, attrs):
    """``quantized_matmul`` with matrix-level gather: each output matrix is
    ``x[lhs_indices[i]] @ w[rhs_indices[i]]`` (transposed as ``transpose``),
    indices being flat positions in the batch axes of ``x`` and of the quantized
    ``w`` (e.g. one expert per token). Operands: ``x``, ``w``, ``scales``,
    ``biases`` (``"affine"`` mode), then ``lhs_indices`` and ``rhs_indices`` where
    those attributes are true (integer arrays broadcast together)."""
    named = dict(zip(attrs.operand_names(), operands))
    return mx.gather_qmm(
        named["x"], named["w"], named["scales"], named.get("biases"),
        lhs_indices=named.get("lhs_indices"), rhs_indices=named.get("rhs_indices"),
        transpose=attrs.transpose, sorted_indices=attrs.sorted_indices,
        **attrs.quant_kwargs(),
    )


class GatherMMAttrs(OperandsAttrs, GatherAttrs):
    """The attributes of ``gather_mm``."""

    def operand_names(self) -> tuple[str, ...]:
        return ("a", "b", *self.index_names())


@register_op("gather_mm", attrs=GatherMMAttrs, operands=(2, 4), check=_check_operands)
def gather_mm(operands, attrs):
    """Matmul with matrix-level gather: each output matrix is
    ``a[lhs_indices[i]] @ b[rhs_indices[i]]``, indices being flat positions in
    the batch axes (all but the last two) of ``a`` and ``b``. Operands: ``a``,
    ``b``, then ``lhs_indices`` and ``rhs_indices`` where those attributes are
    true (integer arrays broadcast together)."""
    named = dict(zip(attrs.operand_names(), operands))
    return mx.gather_mm(named["a"], named["b"], named.get("lhs_indices"),
                        named.get("rhs_indices"), sorted_indices=attrs.sorted_indices)
