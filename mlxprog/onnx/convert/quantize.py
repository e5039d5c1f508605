"""Linear quantization: QuantizeLinear, DequantizeLinear (opset 21+:
per-tensor, per-axis and blocked scales) and DynamicQuantizeLinear.

Integer types only (uint8/int8/uint16/int16, and int32 for DequantizeLinear):
the float8/float4 and 2-/4-bit types are not mapped by the importer.
``QuantizeLinear`` is ``saturate(round_half_even(x / scale) + zero_point)``;
``DequantizeLinear`` is ``(x - zero_point) * scale`` computed in float32 (as
ONNX's reference), then cast to the scale's type (or ``output_dtype``).
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from ...arrays import name_of
from ..context import Context
from ..registry import converter

_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535),
           "int16": (-32768, 32767)}


def _broadcastable(ctx: Context, i: int, value, rank: int, dims: list, axis: int, block: int):
    """Scale/zero point input ``i`` shaped to broadcast against the data (the
    reference's ``reshape_input``): a scalar as it is, a 1-D per-axis vector
    along ``axis``, a blocked one repeated ``block`` times along ``axis``."""
    b = ctx.b
    shape = list(ctx.shape(i))
    size = int(np.prod(shape)) if all(isinstance(d, int) for d in shape) else None
    if not shape or size == 1:
        return b.reshape(value, shape=[]) if shape else value
    if not 0 <= axis < rank:
        raise ctx.fail(f"axis {axis} is out of range for rank {rank}")
    if not block:
        if len(shape) != 1:
            raise ctx.fail(f"input {i}: a per-axis scale/zero point must be 1-D (shape {shape})")
        return b.reshape(value, shape=[shape[0] if j == axis else 1 for j in range(rank)])
    if len(shape) != rank:
        raise ctx.fail(f"input {i}: a blocked scale/zero point must have the data's rank")
    n = dims[axis]
    if not isinstance(n, int) or not all(isinstance(d, int) for d in shape):
        raise ctx.fail("blocked quantization needs static shapes")
    value = b.expand_dims(value, axes=[axis + 1])
    wide = [*shape[:axis + 1], block, *shape[axis + 1:]]
    value = b.broadcast_to(value, shape=wide)
    merged = [*shape[:axis], shape[axis] * block, *shape[axis + 1:]]
    value = b.reshape(value, shape=merged)
    if merged[axis] != n:
        lengths = list(merged)
        lengths[axis] = n
        value = b.slice(value, lengths=lengths, starts=[0] * rank)
    return value


def _axis(ctx: Context, rank: int) -> int:
    """The ``axis`` attribute, normalized (checked where a per-axis or blocked
    scale uses it: a per-tensor one ignores it)."""
    axis = ctx.attr("axis", 1)
    return axis % rank if rank and -rank <= axis < rank else axis


def _quantize(ctx: Context, x, scale, zp, target: str):
    """``clip(round(x / scale) + zp)`` in float32, cast to ``target``."""
    b = ctx.b
    lo, hi = _RANGES[target]
    y = b.round(b.divide(x, scale))
    y = b.astype(y, dtype="float32")
    if zp is not None:
        y = b.add(y, b.astype(zp, dtype="float32"))
    y = b.clip(y, b.constant(float(lo), "float32"), b.constant(float(hi), "float32"))
    return b.astype(y, dtype=target)


@converter("QuantizeLinear")
def quantize_linear(ctx: Context) -> list:
    """``saturate(round(x / y_scale) + y_zero_point)`` (round half to even);
    the output type is the zero point's, else ``output_dtype``, else uint8."""
    b = ctx.b
    dims = list(ctx.shape(0))
    rank = len(dims)
    axis, block = _axis(ctx, rank), ctx.attr("block_size", 0)
    if ctx.has_input(2):
        target = np.dtype(ctx.dtype(2)).name
    elif ctx.attr("output_dtype", 0):
        target = np.dtype(helper.tensor_dtype_to_np_dtype(ctx.attr("output_dtype"))).name
    else:
        target = "uint8"
    if target not in _RANGES:
        raise ctx.fail(f"quantizing to {target} is not supported (supported: "
                       f"{', '.join(_RANGES)})")
    x = ctx.input(0)
    scale = _broadcastable(ctx, 1, ctx.input(1), rank, dims, axis, block)
    precision = ctx.attr("precision", 0)
    if precision:
        p = np.dtype(helper.tensor_dtype_to_np_dtype(precision)).name
        x, scale = b.astype(x, dtype=p), b.astype(scale, dtype=p)
    elif name_of(scale.dtype) != name_of(x.dtype):
        scale = b.astype(scale, dtype=name_of(x.dtype))
    zp = _broadcastable(ctx, 2, ctx.input(2), rank, dims, axis, block) if ctx.has_input(2) else None
    return [_quantize(ctx, x, scale, zp, target)]


@converter("DequantizeLinear")
def dequantize_linear(ctx: Context) -> list:
    """``(x - x_zero_point) * x_scale`` in float32, cast to ``output_dtype``
    or the scale's type."""
    b = ctx.b
    dims = list(ctx.shape(0))
    rank = len(dims)
    axis, block = _axis(ctx, rank), ctx.attr("block_size", 0)
    source = np.dtype(ctx.dtype(0)).name
    if source not in (*_RANGES, "int32"):
        raise ctx.fail(f"dequantizing {source} is not supported")
    x = b.astype(ctx.input(0), dtype="float32")
    if ctx.has_input(2):
        zp = _broadcastable(ctx, 2, ctx.input(2), rank, dims, axis, block)
        x = b.subtract(x, b.astype(zp, dtype="float32"))
    scale = _broadcastable(ctx, 1, ctx.input(1), rank, dims, axis, block)
    out = ctx.attr("output_dtype", 0)
    target = (np.dtype(helper.tensor_dtype_to_np_dtype(out)).name if out
              else np.dtype(ctx.dtype(1)).name)
    y = b.multiply(x, b.astype(scale, dtype="float32"))
    return [b.astype(y, dtype=target)]


@converter("DynamicQuantizeLinear")
def dynamic_quantize_linear(ctx: Context) -> list:
    """uint8 quantization of a float32 tensor over its range (widened to
    hold 0): ``scale = (max - min) / 255``, ``zero_point =
    saturate(round(-min / scale))``; outputs y, scale, zero point."""
    b = ctx.b
    x = ctx.input(0)
    if np.dtype(ctx.dtype(0)) != np.float32:
        raise ctx.fail("DynamicQuantizeLinear takes float32 input only")
    zero = b.constant(0.0, "float32")
    flat = b.reshape(x, shape=[-1])
    hi = b.max(b.reduce_max(flat, axes=[0]), zero)
    lo = b.min(b.reduce_min(flat, axes=[0]), zero)
    scale = b.divide(b.subtract(hi, lo), b.constant(255.0, "float32"))
    zp_f = b.clip(b.round(b.subtract(zero, b.divide(lo, scale))),
                  b.constant(0.0, "float32"), b.constant(255.0, "float32"))
    zp = b.astype(zp_f, dtype="uint8")
    y = _quantize(ctx, x, scale, zp, "uint8")
    return [y, scale, zp]

