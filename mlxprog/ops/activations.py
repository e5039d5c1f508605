"""Fused activations of LLM MLPs: the SwiGLU and GeGLU gates and GELU's
tanh approximation."""

from __future__ import annotations

import math

import mlx.core as mx

from ..arrays import AVal
from ..native import kernels as native
from .registry import register_op


def _check_gated(avals: list[AVal], attrs) -> None:
    """Gate and up that broadcast, or one operand whose last axis holds the
    gate, then up (an even length)."""
    if len(avals) == 2:
        gate, up = avals
        try:
            mx.broadcast_shapes(gate.shape, up.shape)
        except ValueError:
            raise ValueError(f"gate {gate} and up {up} do not broadcast") from None
    elif not avals[0].shape or avals[0].shape[-1] % 2:
        raise ValueError(f"one operand holds gate and up as the halves of its last axis, "
                         f"which must have an even length; found {avals[0]}")


def _gate_and_up(operands: list[mx.array]) -> tuple[mx.array, mx.array]:
    """The gate and up operands, or the halves of one operand's last axis."""
    if len(operands) == 1:
        return tuple(mx.split(operands[0], 2, axis=-1))
    return tuple(operands)


def _gelu_tanh(x: mx.array) -> mx.array:
    """GELU's tanh approximation (``mlx.nn.gelu_approx``)."""
    inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1 + mx.tanh(inner))


def _native_swiglu(avals, attrs) -> bool:
    """Whether the native kernel computes this instruction."""
    if len(avals) == 1:
        return native.covers_swiglu_halves(avals[0])
    return native.covers_swiglu(*avals)


@register_op("fast_swiglu", operands=(1, 2), check=_check_gated, context=True,
             native_coverage=_native_swiglu)
def fast_swiglu(operands, attrs, context):
    """The SwiGLU gate ``silu(gate) * up``. Operands: gate and up
    (broadcasting), or one operand ``[..., 2I]`` holding gate then up along
    its last axis (a fused gate/up projection's output), which gives
    ``[..., I]``. On the CPU with native kernels (float32; two operands of
    one shape) one graph node."""
    out = (native.swiglu_halves(context.native, operands[0]) if len(operands) == 1
           else native.swiglu(context.native, *operands))
    if out is not None:
        return out
    gate, up = _gate_and_up(operands)
    return gate * mx.sigmoid(gate) * up


@register_op("fast_geglu", operands=(1, 2), check=_check_gated)
def fast_geglu(operands, attrs):
    """The GeGLU gate ``gelu_approx(gate) * up`` (Gemma's MLP), GELU's tanh
    approximation as in ``gelu_approx``. Operands as ``fast_swiglu``'s: gate
    and up (broadcasting), or one operand ``[..., 2I]`` holding gate then up
    along its last axis, which gives ``[..., I]``."""
    gate, up = _gate_and_up(operands)
    return _gelu_tanh(gate) * up


@register_op("gelu_approx")
def gelu_approx(operands, attrs):
    """GELU, tanh approximation:
    ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``."""
    return _gelu_tanh(operands[0])
