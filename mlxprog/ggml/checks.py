"""Checks of block bytes read from a file: a scale that is NaN or infinite
makes its whole block so, silently, so the loader refuses it."""

from __future__ import annotations

import numpy as np

from .types import GGMLType

_FP16_EXPONENT = np.uint16(0x7C00)  # all set: NaN or infinite
_FP16_EXPONENT_HIGH = np.uint8(0x7C)  # the same bits in the high byte


def first_nonfinite_block(t: GGMLType, blocks: np.ndarray) -> int | None:
    """The index (in row-major block order) of the first block of ``blocks``
    (uint8, rows of whole blocks of ``t``) whose scale is NaN or infinite,
    or None when every scale is finite."""
    flat = np.ascontiguousarray(blocks).reshape(-1, t.block_bytes)
    bad = np.zeros(len(flat), dtype=bool)
    for offset in t.fp16_scales:
        # An fp16's exponent bits are bits 2-6 of its high (second) byte:
        # one strided byte column, no copy of the scales.
        bad |= (flat[:, offset + 1] & _FP16_EXPONENT_HIGH) == _FP16_EXPONENT_HIGH
    if t.name == "IQ1_M":
        # Its fp16 scale is the top nibbles of the four scale words, low first.
        words = flat[:, 48:56].copy().view(np.uint16)
        scale = ((words[:, 0] >> 12) | ((words[:, 1] >> 8) & 0x00F0)
                 | ((words[:, 2] >> 4) & 0x0F00) | (words[:, 3] & 0xF000))
        bad |= (scale & _FP16_EXPONENT) == _FP16_EXPONENT
    if t.name == "MXFP4":
        bad |= flat[:, 0] == 0xFF  # E8M0's NaN
    if not bad.any():
        return None
    return int(np.flatnonzero(bad)[0])
