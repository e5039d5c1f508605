"""Random but valid blocks of every GGML block type, for the tests: random
code bytes (every bit pattern) with finite scales of a chosen size, and
gguf's own dequantization of them (llama.cpp's numpy reference)."""

from __future__ import annotations

import gguf
import numpy as np

from mlxprog.ggml import types as ggml_types


def reference(type_name: str, blocks: np.ndarray) -> np.ndarray:
    """gguf's dequantization of ``blocks`` (uint8 rows) as float32."""
    return gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[type_name]).astype(np.float32)


def set_iq1_m_d(blocks: np.ndarray, d: np.ndarray) -> None:
    """Write fp16 ``d`` (one per block) into IQ1_M ``blocks`` (uint8
    ``[n, 56]``) in place: its four nibbles top the four uint16 scale words
    at byte 48, lowest first; their low 12 bits (the sub-scales) stay."""
    words = blocks[:, 48:56].copy().view(np.uint16)
    nibbles = (d.view(np.uint16)[:, None] >> np.array([0, 4, 8, 12], np.uint16)) & np.uint16(0xF)
    blocks[:, 48:56] = ((words & np.uint16(0x0FFF)) | (nibbles << np.uint16(12))).view(np.uint8)


def random_blocks(rng: np.random.Generator, type_name: str, rows: int, elements: int,
                  scale: float = 0.01) -> np.ndarray:
    """``rows`` rows of ``elements`` values (a whole number of blocks) of
    ``type_name``: random code bytes, every fp16 scale field uniform in
    [scale / 5, scale] (IQ1_M's spread scale too), MXFP4's exponents near
    2**-7; uint8 ``[rows, row_bytes]``."""
    t = ggml_types.BY_NAME[type_name]
    count = rows * elements // t.block
    raw = rng.integers(0, 256, (count, t.block_bytes), dtype=np.uint8)
    for offset in t.fp16_scales:
        halves = rng.uniform(scale / 5, scale, count).astype(np.float16)
        raw[:, offset:offset + 2] = halves.view(np.uint8).reshape(count, 2)
    if type_name == "IQ1_M":
        set_iq1_m_d(raw, rng.uniform(scale / 5, scale, count).astype(np.float16))
    if type_name == "MXFP4":
        exponent = int(np.floor(np.log2(scale))) + 127
        raw[:, 0] = rng.integers(exponent - 3, exponent + 1, count)
    return raw.reshape(rows, count // rows * t.block_bytes)


def blocks_with_std(rng: np.random.Generator, type_name: str, rows: int, elements: int,
                    std: float) -> np.ndarray:
    """:func:`random_blocks` whose dequantized values have about ``std`` as
    their standard deviation (a model's weights of that size)."""
    probe = random_blocks(rng, type_name, rows, elements)
    measured = float(np.std(reference(type_name, probe))) or 1.0
    return random_blocks(rng, type_name, rows, elements, scale=0.01 * std / measured)


def activation_bound(x: np.ndarray, dense: np.ndarray, t) -> np.ndarray:
    """The int8 numerics' error bound of ``x [..., K] @ dense.T`` (``dense``
    the dequantized ``[N, K]`` weights of type ``t``): sum over activation
    blocks of half a quantization step (the block's largest magnitude / 127
    / 2, with a margin) times the weights' magnitudes. MLX's ops compute
    exactly, which is within it."""
    block = 256 if t.activation == "q8_K" else 32
    rows = x.reshape(-1, x.shape[-1]).astype(np.float64)
    steps = np.abs(rows.reshape(len(rows), -1, block)).max(axis=-1) / 127 * 0.51
    per_element = np.repeat(steps, block, axis=-1)
    return (per_element @ np.abs(dense).T).reshape(*x.shape[:-1], -1)
