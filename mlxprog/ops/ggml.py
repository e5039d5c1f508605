"""GGML's block-quantized matrices (GGUF's weights, kept in the file's own
blocks): ``ggml_matmul`` and ``ggml_dequantize``.

A matrix of GGML type ``type`` (``Q4_K``, ``IQ4_XS``, ... : the block types
of :mod:`mlxprog.ggml.types`) is a ``uint8 [rows, row_bytes]`` array, each
row its blocks exactly as the file stores them. On the CPU with native
kernels both ops run mlxprog's per-type kernels; elsewhere they dequantize
with MLX ops (:mod:`mlxprog.ggml.dequantize`), which gives the same floats
as gguf's own dequantizer on any device.
"""

from __future__ import annotations

import mlx.core as mx
from pydantic import field_validator

from ..arrays import AVal, is_floating
from ..ggml import types as ggml_types
from ..ggml.dequantize import dequantize as dequantize_blocks
from ..native import kernels as native
from ..native import record_numerics_fallback
from .attrs import Attrs
from .quant import Numerics
from .registry import register_op


class GGMLAttrs(Attrs):
    """The GGML block type of a matrix (its name as llama.cpp spells it)."""

    type: str

    @field_validator("type")
    @classmethod
    def _block_type(cls, name: str) -> str:
        if name not in ggml_types.BLOCK_TYPES:
            raise ValueError(f"type must be a GGML block type "
                             f"({', '.join(ggml_types.BLOCK_TYPES)}); found {name!r}")
        return name

    @property
    def ggml(self) -> ggml_types.GGMLType:
        """The type's layout."""
        return ggml_types.BY_NAME[self.type]


class GGMLMatmulAttrs(GGMLAttrs):
    """The attributes of ``ggml_matmul``."""

    numerics: Numerics = "int8"


def row_elements(blocks: AVal, attrs: GGMLAttrs, name: str) -> int:
    """The elements of a row of ``blocks`` (uint8, whole blocks of the type)."""
    t = attrs.ggml
    if blocks.dtype != mx.uint8 or not blocks.shape or blocks.shape[-1] % t.block_bytes:
        raise ValueError(f"{name} must be uint8 [..., row_bytes] holding whole {t.name} blocks "
                         f"({t.block_bytes} bytes each); found {blocks}")
    return blocks.shape[-1] // t.block_bytes * t.block


def _check_ggml_matmul(avals: list[AVal], attrs: GGMLMatmulAttrs) -> None:
    """x float ``[..., K]``, w uint8 ``[N, K / block * block_bytes]``."""
    x, w = avals
    if not is_floating(x.dtype) or x.dtype == mx.float64 or not x.shape:
        raise ValueError(f"x must be a float16, bfloat16 or float32 [..., K]; found {x}")
    if len(w.shape) != 2:
        raise ValueError(f"w must be a 2-D uint8 [N, row_bytes]; found {w}")
    k = row_elements(w, attrs, "w")
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, but a row of w holds {k} "
                         f"{attrs.type} values")


def _ggml_matmul_shape(avals: list[AVal], attrs: GGMLMatmulAttrs) -> list[AVal]:
    x, w = avals
    return [AVal((*x.shape[:-1], w.shape[0]), mx.float32)]


def _native_ggml_matmul(avals: list[AVal], attrs: GGMLMatmulAttrs) -> bool:
    """Whether the native kernel computes this instruction."""
    return native.covers_ggml(avals[0], avals[1], attrs.ggml)


@register_op("ggml_matmul", attrs=GGMLMatmulAttrs, operands=2, check=_check_ggml_matmul,
             shape_rule=_ggml_matmul_shape, native_coverage=_native_ggml_matmul, context=True)
def ggml_matmul(operands, attrs, context):
    """``x @ dequantize(w).T`` as float32, ``w`` a GGML block-quantized
    matrix: ``uint8 [N, row_bytes]``, each row ``K / block`` blocks of
    ``type`` (``Q4_K``, ``Q6_K``, ``IQ4_XS``, ...; see docs/llm.md for the
    list), exactly the bytes a GGUF file stores. ``x`` is ``[..., K]``.

    ``numerics``:

    - ``"int8"`` (the default): as llama.cpp, each row of ``x`` is quantized
      into 8-bit blocks (Q8_0 blocks of 32 for the 32-element types, Q8_1
      for Q4_1 and Q5_1, Q8_K blocks of 256 for the K-quants and IQ types)
      and the products are integer dot products per block, scaled in float;
    - ``"exact"``: each weight is dequantized exactly as gguf's dequantizer
      does and the products are float32.

    On the CPU with native kernels it runs the type's kernel; elsewhere the
    matrix is dequantized with MLX ops and multiplied in float32 (int8
    numerics then compute ``"exact"``, and ``exe.stats.numerics_fallbacks``
    counts it)."""
    x, w = operands
    t = attrs.ggml
    result = native.ggml_matmul(context.native, x, w, t, int8=attrs.numerics == "int8")
    if result is not None:
        return result
    if attrs.numerics == "int8":
        reason = (native.inactive_reason(context.native)
                  or "the native kernel does not cover these operands (dtypes, shapes)")
        record_numerics_fallback(context.native, "ggml_matmul", f"int8 computed exactly: {reason}")
    return mx.matmul(x.astype(mx.float32), dequantize_blocks(t.name, w).T)


def _check_ggml_dequantize(avals: list[AVal], attrs: GGMLAttrs) -> None:
    """blocks uint8 ``[..., row_bytes]`` of whole blocks."""
    row_elements(avals[0], attrs, "blocks")


def _ggml_dequantize_shape(avals: list[AVal], attrs: GGMLAttrs) -> list[AVal]:
    blocks = avals[0]
    return [AVal((*blocks.shape[:-1], row_elements(blocks, attrs, "blocks")), mx.float32)]


def _native_ggml_dequantize(avals: list[AVal], attrs: GGMLAttrs) -> bool:
    """Whether the native kernel computes this instruction."""
    return native.covers_ggml(None, avals[0], attrs.ggml)


@register_op("ggml_dequantize", attrs=GGMLAttrs, check=_check_ggml_dequantize,
             shape_rule=_ggml_dequantize_shape, native_coverage=_native_ggml_dequantize,
             context=True)
def ggml_dequantize(operands, attrs, context):
    """Rows of GGML blocks of ``type`` (``uint8 [..., row_bytes]``) as
    float32 ``[..., row_bytes / block_bytes * block]``, exactly as gguf's
    dequantizer computes them (e.g. the embedding rows of the tokens, taken
    from a block-quantized embedding matrix)."""
    blocks = operands[0]
    t = attrs.ggml
    result = native.ggml_dequantize(context.native, blocks, t)
    return result if result is not None else dequantize_blocks(t.name, blocks)
