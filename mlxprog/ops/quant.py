"""Quantization, as ``mx.quantize``: packing weights, unpacking them, matmuls
on packed weights, and the gathered (mixture-of-experts) matmuls. A quantized
matrix is a packed ``uint32`` weight plus per-group ``scales`` and, in
``"affine"`` mode only, ``biases`` (see ``quantize`` for the modes). Which
operands an op takes follows from its attributes: ``mode`` decides whether
``biases`` is present, ``lhs_indices``/``rhs_indices`` whether the index
operands are; each op's entry lists them in order.
"""

from __future__ import annotations

import math
from typing import Literal

import mlx.core as mx
from pydantic import field_validator, model_validator

from ..arrays import AVal, is_integer, name_of, to_mlx
from ..native import kernels as native
from ..native import record_numerics_fallback
from .attrs import Attrs, DType
from .index import clamp_index
from .registry import register_op

Mode = Literal["affine", "mxfp4", "mxfp8", "nvfp4"]
# How quantized_matmul multiplies: "exact" as MLX (weights dequantized to
# floats, float products); "int8" as llama.cpp (activations quantized to 8
# bits per weight group, integer dot products). See quantized_matmul.
Numerics = Literal["exact", "int8"]

# mode: (group sizes, bits) that MLX supports.
_SUPPORTED: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "affine": ((32, 64, 128), (1, 2, 3, 4, 5, 6, 8)),
    "mxfp4": ((32,), (4,)),
    "mxfp8": ((32,), (8,)),
    "nvfp4": ((16,), (4,)),
}


# MLX's quantization kernels compute in these dtypes: float64 fails at evaluation
# (affine quantize, the quantized matmuls) or gives wrong values (mxfp8 and nvfp4
# quantize and dequantize), so no operand or result of these ops is float64.
_FLOATS = ("float16", "bfloat16", "float32")


def _reject_float64(avals: dict[str, AVal]) -> None:
    """No operand in ``avals`` (name: aval) is float64."""
    for name, aval in avals.items():
        if aval.dtype == mx.float64:
            raise ValueError(
                f"{name} is float64, which MLX's quantization kernels do not support; "
                f"use {', '.join(_FLOATS)}"
            )


class OperandsAttrs(Attrs):
    """Attributes that decide which operands an op takes: ``operand_names()``
    lists them in order, and the ops' check (``check_operands``) requires
    exactly those."""

    def operand_names(self) -> tuple[str, ...]:
        """The names of the operands these attributes call for, in order."""
        raise NotImplementedError


def check_operands(avals: list[AVal], attrs: OperandsAttrs) -> None:
    """The instruction gives exactly the operands its attributes call for."""
    names = attrs.operand_names()
    if len(avals) != len(names):
        raise ValueError(
            f"with these attributes the operands are ({', '.join(names)}): "
            f"{len(names)} expected, found {len(avals)}"
        )


def _check_quantized(avals: list[AVal], attrs: OperandsAttrs) -> None:
    """The operands its attributes call for, none of the floating ones float64."""
    check_operands(avals, attrs)
    named = dict(zip(attrs.operand_names(), avals))
    _reject_float64({k: v for k, v in named.items() if k in ("x", "scales", "biases")})


def _check_quantize(avals: list[AVal], attrs: OperandsAttrs) -> None:
    """One operand ``w`` of a dtype MLX quantizes."""
    check_operands(avals, attrs)
    if name_of(avals[0].dtype) not in _FLOATS:
        raise ValueError(f"w must be {', '.join(_FLOATS)}; found {avals[0]}")


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


# The scale code that marks a group holding NaN, where scales are 8-bit codes:
# E8M0's NaN (MLX decodes it as 2**128, and with zero codes that is 0 * inf = NaN)
# and E4M3's NaN.
_NAN_SCALE = {"mxfp4": 255, "mxfp8": 255, "nvfp4": 0x7F}


def _mark_nan_groups(w: mx.array, parts: tuple[mx.array, ...], attrs: QuantAttrs):
    """``parts`` (of ``mx.quantize(w)``) with every group of ``w`` that holds a
    NaN stored so that it dequantizes to NaN throughout.

    MLX defines no NaN handling: affine drops a NaN, and the MX modes give
    scales that differ between compiled and eager evaluation (and by dtype)."""
    group_size, bits = attrs.resolved()
    groups = w.reshape(*w.shape[:-1], w.shape[-1] // group_size, group_size)
    has_nan = mx.isnan(groups).any(axis=-1)
    if attrs.mode == "affine":
        nan = mx.array(float("nan"), parts[1].dtype)
        return parts[0], *(mx.where(has_nan, nan, p) for p in parts[1:])
    packed, scales = parts
    words = packed.reshape(*has_nan.shape, group_size * bits // 32)
    codes = mx.where(has_nan[..., None], mx.array(0, packed.dtype), words)
    nan_scale = mx.array(_NAN_SCALE[attrs.mode], scales.dtype)
    return codes.reshape(packed.shape), mx.where(has_nan, nan_scale, scales)


@register_op("quantize", attrs=QuantAttrs, outputs=lambda attrs, n: len(attrs.parts()),
             check=_check_quantize)
def quantize(operands, attrs):
    """Quantize ``w`` (rank >= 2, float16, bfloat16 or float32, last axis
    divisible by ``group_size``) in groups along its last axis. Results: packed
    ``w`` (``uint32``), ``scales`` and, in ``"affine"`` mode, ``biases``.

    The modes, with the group sizes and bits MLX supports (null: the first):

    | mode | group_size | bits | biases |
    | --- | --- | --- | --- |
    | ``affine`` | 64, 32, 128 | 4, 1, 2, 3, 5, 6, 8 | yes |
    | ``mxfp4`` | 32 | 4 | no |
    | ``mxfp8`` | 32 | 8 | no |
    | ``nvfp4`` | 16 | 4 | no |

    A group that holds a NaN dequantizes to NaN in every element: in
    ``"affine"`` mode its scale and bias are NaN; in the others its codes are 0
    and its scale is the scale format's NaN code (255 for ``mxfp4``/``mxfp8``'s
    E8M0 scales, 127 for ``nvfp4``'s E4M3 scales).

    float64 is rejected by every quantization op (MLX's kernels fail on it or
    give wrong values)."""
    w = operands[0]
    return _mark_nan_groups(w, tuple(mx.quantize(w, **attrs.quant_kwargs())), attrs)


class DequantizeAttrs(QuantAttrs):
    """The attributes of ``dequantize``."""

    dtype: DType | None = None

    @field_validator("dtype")
    @classmethod
    def _supported_dtype(cls, dtype: str | None) -> str | None:
        if dtype is not None and dtype not in _FLOATS:
            raise ValueError(f"dtype must be {', '.join(_FLOATS)} (or null); found {dtype}")
        return dtype

    def operand_names(self) -> tuple[str, ...]:
        return self.parts()


@register_op("dequantize", attrs=DequantizeAttrs, operands=(2, 3), check=_check_quantized)
def dequantize(operands, attrs):
    """Unpack a quantized matrix back to floats of ``dtype`` (null: the scales'
    dtype in ``"affine"`` mode, else ``bfloat16``). Operands: ``w``, ``scales``,
    and ``biases`` in ``"affine"`` mode. Neither ``dtype`` nor the scales and
    biases may be float64."""
    named = dict(zip(attrs.operand_names(), operands))
    dtype = None if attrs.dtype is None else to_mlx(attrs.dtype)
    return mx.dequantize(named["w"], named["scales"], named.get("biases"), dtype=dtype,
                         **attrs.quant_kwargs())


class MatmulAttrs(QuantAttrs):
    """The attributes of a matmul on a quantized matrix."""

    transpose: bool = True  # x @ w.T (w stored as (out, in)); False: x @ w

    def operand_names(self) -> tuple[str, ...]:
        return ("x", *self.parts())


class QuantizedMatmulAttrs(MatmulAttrs):
    """The attributes of ``quantized_matmul``."""

    numerics: Numerics = "exact"


def _native_quantized_matmul(avals, attrs) -> bool:
    """Whether a native quantized-matmul kernel computes this instruction (in
    int8 numerics: the int8 one)."""
    named = dict(zip(attrs.operand_names(), avals))
    group_size, bits = attrs.resolved()
    args = (named["x"], named["w"], named["scales"], named.get("biases"), attrs.transpose,
            group_size, bits, attrs.mode)
    if attrs.numerics == "int8":
        return not native.int8_uncovered_reason(*args)
    return native.covers_quantized_matmul(*args)


@register_op("quantized_matmul", attrs=QuantizedMatmulAttrs, operands=(3, 4),
             check=_check_quantized, native_coverage=_native_quantized_matmul, context=True)
def quantized_matmul(operands, attrs, context):
    """``x @ dequantize(w).T`` (or ``x @ dequantize(w)`` without ``transpose``),
    computed on the packed weight. Operands: ``x``, ``w``, ``scales``, and
    ``biases`` in ``"affine"`` mode; none of them float64. The result dtype is
    the promoted dtype of ``x`` and (in ``"affine"`` mode) the scales and
    biases.

    ``numerics`` says how it multiplies:

    - ``"exact"`` (the default): as MLX, float products of ``x`` with the
      dequantized weights, accumulated in float32;
    - ``"int8"``: as llama.cpp, each group of ``group_size`` elements of a row
      of ``x`` is quantized to int8 with one float32 scale (``d = max|x| /
      127``, ``q = round(x * 127 / max|x|)``, half to even) and the result is
      ``dequantize(w) @ (d * q)``, computed with integer dot products per
      group; a group holding an infinity or NaN makes its row's results NaN.
      Several times faster on the CPU, and within the activation rounding of
      ``"exact"`` (at most ``sum_g d_g / 2 * sum |w|`` over the group).
      It runs on mlxprog's native CPU kernel (affine mode, ``transpose``, 4-
      or 8-bit codes, the kernel's dtypes and shapes); elsewhere (another
      device, native kernels off, other bits) the instruction computes
      ``"exact"`` and ``exe.stats.numerics_fallbacks`` counts it, with the
      reason."""
    named = dict(zip(attrs.operand_names(), operands))
    x, w, scales, biases = named["x"], named["w"], named["scales"], named.get("biases")
    group_size, bits = attrs.resolved()
    kwargs = dict(transpose=attrs.transpose, mode=attrs.mode, group_size=group_size, bits=bits)
    if attrs.numerics == "int8":
        result, reason = native.quantized_matmul_int8(context.native, x, w, scales, biases,
                                                      **kwargs)
        if result is not None:
            return result
        record_numerics_fallback(context.native, "quantized_matmul",
                                 f"int8 computed exactly: {reason}")
    result = native.quantized_matmul(context.native, x, w, scales, biases, **kwargs)
    if result is not None:
        return result
    return mx.quantized_matmul(x, w, scales, biases, transpose=attrs.transpose,
                               **attrs.quant_kwargs())


def _check_gather_indices(avals: list[AVal], attrs, lhs: str, rhs: str) -> None:
    """The operands the attributes call for; no index operand with elements
    picks from an empty batch of matrices (``lhs``, ``rhs``: their names)."""
    check_operands(avals, attrs)
    named = dict(zip(attrs.operand_names(), avals))
    for index, matrices in (("lhs_indices", lhs), ("rhs_indices", rhs)):
        if index not in named:
            continue
        if not is_integer(named[index].dtype):
            raise ValueError(f"{index} must have an integer dtype; found {named[index]}")
        batch = named[matrices].shape[:-2]
        if math.prod(named[index].shape) and not math.prod(batch):
            raise ValueError(
                f"{index} picks from the batch axes {list(batch)} of {matrices}, "
                f"which hold no matrix; found {named[index]}"
            )


def _batch_indices(named: dict[str, mx.array], lhs: mx.array,
                   rhs: mx.array) -> dict[str, mx.array]:
    """The index operands in ``named``, clamped into the flattened batch axes
    of the matrices they pick (``lhs``, ``rhs``) after counting negative ones
    from the end, as ``take``: MLX reads outside the arrays otherwise."""
    clamped = {}
    for index, matrices in (("lhs_indices", lhs), ("rhs_indices", rhs)):
        if index in named:
            clamped[index] = clamp_index(named[index], math.prod(matrices.shape[:-2]))
    return clamped


class GatherAttrs(Attrs):
    """Which index operands a gathered matmul takes (each absent one: every
    batch entry in order, as MLX's ``None``)."""

    lhs_indices: bool = False
    rhs_indices: bool = False
    sorted_indices: bool = False  # a hint: the indices are sorted

    def index_names(self) -> tuple[str, ...]:
        return tuple(name for name in ("lhs_indices", "rhs_indices") if getattr(self, name))


class GatherQMMAttrs(MatmulAttrs, GatherAttrs):
    """The attributes of ``gather_qmm``."""

    def operand_names(self) -> tuple[str, ...]:
        return (*super().operand_names(), *self.index_names())


def _check_gather_qmm(avals: list[AVal], attrs: GatherQMMAttrs) -> None:
    """The operands the attributes call for, none of the floating ones
    float64, and no index into an empty batch."""
    _check_quantized(avals, attrs)
    _check_gather_indices(avals, attrs, "x", "w")


@register_op("gather_qmm", attrs=GatherQMMAttrs, operands=(3, 6), check=_check_gather_qmm)
def gather_qmm(operands, attrs):
    """``quantized_matmul`` with matrix-level gather: each output matrix is
    ``x[lhs_indices[i]] @ w[rhs_indices[i]]`` (transposed as ``transpose``),
    indices being flat positions in the batch axes of ``x`` and of the quantized
    ``w`` (e.g. one expert per token). Operands: ``x``, ``w``, ``scales``,
    ``biases`` (``"affine"`` mode), then ``lhs_indices`` and ``rhs_indices`` where
    those attributes are true (integer arrays broadcast together). Negative
    indices count from the end; out-of-range ones are clamped."""
    named = dict(zip(attrs.operand_names(), operands))
    return mx.gather_qmm(
        named["x"], named["w"], named["scales"], named.get("biases"),
        **_batch_indices(named, named["x"], named["w"]),
        transpose=attrs.transpose, sorted_indices=attrs.sorted_indices,
        **attrs.quant_kwargs(),
    )


class GatherMMAttrs(OperandsAttrs, GatherAttrs):
    """The attributes of ``gather_mm``."""

    def operand_names(self) -> tuple[str, ...]:
        return ("a", "b", *self.index_names())


def _check_gather_mm(avals: list[AVal], attrs: GatherMMAttrs) -> None:
    """The operands the attributes call for, and no index into an empty batch."""
    _check_gather_indices(avals, attrs, "a", "b")


@register_op("gather_mm", attrs=GatherMMAttrs, operands=(2, 4), check=_check_gather_mm)
def gather_mm(operands, attrs):
    """Matmul with matrix-level gather: each output matrix is
    ``a[lhs_indices[i]] @ b[rhs_indices[i]]``, indices being flat positions in
    the batch axes (all but the last two) of ``a`` and ``b``. Operands: ``a``,
    ``b``, then ``lhs_indices`` and ``rhs_indices`` where those attributes are
    true (integer arrays broadcast together). Negative indices count from the
    end; out-of-range ones are clamped."""
    named = dict(zip(attrs.operand_names(), operands))
    indices = _batch_indices(named, named["a"], named["b"])
    return mx.gather_mm(named["a"], named["b"], indices.get("lhs_indices"),
                        indices.get("rhs_indices"), sorted_indices=attrs.sorted_indices)
