"""Integer offset and position operands shared by the attention and RoPE
ops: their check, and the int32 the kernels take, clamped so none wraps."""

from __future__ import annotations

import mlx.core as mx

from ..arrays import AVal, is_integer
from .index import clamp_integer

_INT32 = mx.iinfo(mx.int32)  # the RoPE kernels take int32 positions


def _check_offset(offset: AVal, what: str, sizes: tuple[tuple[int, ...], ...] = ((), (1,))) -> None:
    """An offset operand is an integer array of one of the shapes ``sizes``."""
    if not is_integer(offset.dtype) or offset.shape not in sizes:
        shapes = " or ".join(str(list(s)) for s in sizes)
        raise ValueError(f"{what} must be an integer array of shape {shapes}, found {offset}")


def _int32_positions(positions: mx.array) -> mx.array:
    """Integer positions as the int32 the RoPE kernels take, clamped into
    int32's range (so none wraps)."""
    if positions.dtype == mx.int32:
        return positions  # no graph node (each costs time on every replay)
    return clamp_integer(positions, _INT32.min, _INT32.max, mx.int32)

