"""Fused norms of LLM layers: RMS norm, a residual add with the RMS norm of
its result, and layer norm."""

from __future__ import annotations

from typing import Annotated

import mlx.core as mx
from pydantic import Field

from ..arrays import AVal
from ..native import kernels as native
from .attrs import Attrs
from .registry import register_op

NonNegativeFloat = Annotated[float, Field(ge=0)]


class NormAttrs(Attrs):
    """The attributes of ``fast_rms_norm`` and ``fast_layer_norm``."""

    eps: NonNegativeFloat = 1e-5


@register_op("fast_rms_norm", attrs=NormAttrs, operands=2, context=True,
             native_coverage=lambda avals, attrs: native.covers_rms_norm(*avals))
def fast_rms_norm(operands, attrs, context):
    """RMS norm over the last axis, ``x / sqrt(mean(x**2) + eps) * weight``
    (``mx.fast.rms_norm``). Operands: x ``[..., D]``, weight ``[D]``."""
    x, weight = operands
    out = native.rms_norm(context.native, x, weight, attrs.eps)
    return out if out is not None else mx.fast.rms_norm(x, weight, attrs.eps)


def _check_add_rms_norm(avals: list[AVal], attrs: NormAttrs) -> None:
    """x and y of one shape and dtype, and a weight ``[D]``."""
    x, y, weight = avals
    if x != y:
        raise ValueError(f"x and y must have one shape and dtype, found {x} and {y}")
    if len(x.shape) < 1 or weight.shape != (x.shape[-1],):
        raise ValueError(f"weight must be [{x.shape[-1] if x.shape else 'D'}] (x's last axis), "
                         f"found {weight}")


@register_op("fast_add_rms_norm", attrs=NormAttrs, operands=3, outputs=2,
             check=_check_add_rms_norm, context=True,
             native_coverage=lambda avals, attrs: native.covers_add_rms_norm(*avals))
def fast_add_rms_norm(operands, attrs, context):
    """A residual add and the RMS norm of its result, as in every layer of a
    transformer: results ``s = x + y`` and ``fast_rms_norm(s, weight)``.
    Operands: x, y ``[..., D]`` (one shape and dtype), weight ``[D]``. On the
    CPU with native kernels (float32) one graph node instead of two."""
    x, y, weight = operands
    out = native.add_rms_norm(context.native, x, y, weight, attrs.eps)
    if out is not None:
        return tuple(out)
    total = x + y
    return total, fast_rms_norm([total, weight], attrs, context)


@register_op("fast_layer_norm", attrs=NormAttrs, operands=(2, 3))
def fast_layer_norm(operands, attrs):
    """Layer norm over the last axis, ``(x - mean) / sqrt(var + eps) * weight + bias``
    (``mx.fast.layer_norm``). Operands: x ``[..., D]``, weight ``[D]``, and an
    optional bias ``[D]``."""
    x, weight, *bias = operands
    return mx.fast.layer_norm(x, weight, bias[0] if bias else None, attrs.eps)
