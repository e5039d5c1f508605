"""Checks of block bytes read from a file: a scale that is NaN or infinite
makes its whole block so, silently, so the loader refuses it."""

from __future__ import annotations

import numpy as np

from .types import GGMLType

_FP16_EXPONENT = np.uint16(0x7C00)


def first_nonfinite_block(t: GGMLType, blocks: np.ndarray) -> int | None:
    """The index (in row-major block order) of the first block of ``blocks``
    (uint8, rows of whole blocks of ``t``) whose scale is NaN or infinite,
    or None when every scale is finite."""
    flat = np.ascontiguousarray(blocks).reshape(-1, t.block_bytes)
    bad = np.zeros(len(flat), dtype=bool)
    for offset in t.fp16_scales:
        bad |= _nonfinite(flat[:, offset:offset + 2].copy().view(np.uint16)[:, 0])
    if t.name == "IQ1_M":
        # Its fp16 scale is the top nibbles of the four scale words, low first.
        words = flat[:, 48:56].copy().view(np.uint16)
        scale = ((words[:, 0] >> 12) | ((words[:, 1] >> 8) & 0x00F0)
                 | ((words[:, 2] >> 4) & 0x0F00) | (words[:, 3] & 0xF000))
        bad |= _nonfinite(scale.astype(np.uint16))
    if t.name == "MXFP4":
        bad |= flat[:, 0] == 0xFF  # E8M0's NaN
    found = np.flatnonzero(bad)
    return int(found[0]) if found.size else None


def _nonfinite(halves: np.ndarray) -> np.ndarray:
    """Which fp16 bit patterns are NaN or infinite (all exponent bits set)."""
    return (halves & _FP16_EXPONENT) == _FP16_EXPONENT
