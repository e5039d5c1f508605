"""Re-layout of the GGML types that MLX's affine quantization holds exactly.

MLX's affine format stores, per group of ``group_size`` elements of a row,
``value = scale * code + bias``, with the codes of a row packed
little-endian into ``uint32`` (element ``i``'s ``bits`` bits at bit
``i * bits`` of the row's bit stream). Several GGML types are that very
form per 32-element group, so their blocks can be re-laid once at load
(numpy, here) and run by MLX's ``quantized_matmul`` / ``dequantize``:

=======  ====  ================  ==================  ====================
type     bits  code              scale               bias
=======  ====  ================  ==================  ====================
Q4_0     4     q (0..15)         d                   -8 d
Q4_1     4     q                 d                   m
Q5_0     5     q (0..31)         d                   -16 d
Q5_1     5     q                 d                   m
Q8_0     8     q + 128           d                   -128 d
Q4_K     4     q                 d * sc              -(dmin * m)
Q5_K     5     q                 d * sc              -(dmin * m)
=======  ====  ================  ==================  ====================

Scales and biases are float16 for the legacy types, whose values are fp16s
of the file times a power of two (a tensor where ``-8 d`` etc. overflows
fp16 gets float32 ones instead), and float32 for Q4_K/Q5_K, whose ``d * sc``
needs up to 17 significant bits.

Exactness: every product ``scale * code`` is exact in float32 (at most 22
significant bits), so float32 arithmetic gives llama.cpp's values: the
zero-point types' ``d * (q - 8)`` is ``d * q + (-8 d)`` exactly, and
``(d * q) + m`` / ``(d * sc) * q - dmin * m`` are llama.cpp's own two
roundings. Two limits, both MLX's: ``mx.dequantize`` computes in the
scales' dtype, so fp16 scales must be cast to float32 for exact float32
values (``quantized_matmul`` with float32 inputs computes in float32
already); and where llama.cpp gives ``-0.0`` (a negative ``d`` times a zero
code of Q4_0/Q5_0/Q8_0) the affine form gives ``+0.0``.

MXFP4 is not affine (its 16 values are not evenly spaced) and stays as
blocks.
"""

from __future__ import annotations

import numpy as np

from .types import BY_NAME

#: The group of every re-laid type: one legacy block, or one sub-block of
#: a K-quant super-block.
GROUP_SIZE = 32


def affine_types() -> tuple[str, ...]:
    """The GGML types :func:`to_affine` re-lays."""
    return tuple(_RELAYOUTS)


def to_affine(type_name: str, blocks: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Re-lay ``blocks`` (``uint8 [..., row_bytes]``, the file's bytes of a
    ``type_name`` tensor) as MLX's affine quantization: ``(w, scales,
    biases, bits, group_size)`` with ``w`` ``uint32 [..., K * bits / 32]``
    and ``scales``/``biases`` ``[..., K / group_size]`` (K the row's
    elements), such that ``mx.dequantize(w, scales, biases, group_size,
    bits)`` in float32 gives llama.cpp's dequantization.

    Raises :class:`ValueError` for a type MLX's affine form does not hold
    (see :func:`affine_types`), a dtype other than uint8, or a row that is
    not a whole number of blocks."""
    if type_name not in _RELAYOUTS:
        raise ValueError(f"{type_name!r} has no exact MLX affine form "
                         f"(affine types: {', '.join(_RELAYOUTS)})")
    t = BY_NAME[type_name]
    blocks = np.asarray(blocks)
    if blocks.dtype != np.uint8 or blocks.ndim == 0:
        raise ValueError(f"{type_name} blocks must be uint8 [..., row_bytes], "
                         f"got {blocks.dtype} of shape {blocks.shape}")
    row_bytes = blocks.shape[-1]
    if row_bytes % t.block_bytes:
        raise ValueError(f"{type_name} row_bytes {row_bytes} is not a whole number of "
                         f"{t.block_bytes}-byte blocks")
    lead = blocks.shape[:-1]
    rows = np.ascontiguousarray(blocks).reshape(-1, row_bytes)
    # A few thousand blocks at a time: the codes' intermediates take 8 bytes
    # an element, which for a whole embedding matrix would be gigabytes.
    step = max(1, _CHUNK_BLOCKS * t.block_bytes // max(row_bytes, 1))
    parts = [_RELAYOUTS[type_name](rows[i:i + step].reshape(-1, t.block_bytes))
             for i in range(0, max(len(rows), 1), step)]
    bits = parts[0][3]
    groups = row_bytes // t.block_bytes * t.block // GROUP_SIZE
    packed = np.concatenate([_pack(codes, bits).reshape(-1) for codes, *_ in parts])
    scales = _joined([part[1] for part in parts])
    biases = _joined([part[2] for part in parts])
    return (packed.reshape(*lead, -1), scales.reshape(*lead, groups),
            biases.reshape(*lead, groups), bits, GROUP_SIZE)


#: The blocks :func:`to_affine` re-lays at once.
_CHUNK_BLOCKS = 1 << 14


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """Chunks' scales (or biases) in one array, float32 for all where one
    chunk needed float32 (see :func:`_zero_point`)."""
    dtype = np.result_type(*parts)
    return np.concatenate([p.reshape(-1).astype(dtype, copy=False) for p in parts])


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes ``[n, elements]`` (each below ``2**bits``) as MLX packs them:
    a little-endian bit stream of ``bits`` per code, read as uint32. Eight
    codes fill ``bits`` whole bytes, so each eight are gathered in a uint64
    whose low ``bits`` bytes are the stream's."""
    eight = codes.reshape(codes.shape[0], -1, 8).astype(np.uint64)
    word = np.bitwise_or.reduce(eight << (bits * np.arange(8, dtype=np.uint64)), axis=-1)
    stream = word.astype("<u8").view(np.uint8).reshape(*word.shape, 8)[..., :bits]
    return np.ascontiguousarray(stream).reshape(codes.shape[0], -1).view("<u4").astype(np.uint32)


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    """The fp16 field at byte ``at`` of each block, ``[blocks]``."""
    return np.ascontiguousarray(b[:, at:at + 2]).view("<f2").reshape(-1)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """The 4-bit codes of bytes ``[..., n]``: low nibbles, then high ones."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=-1)


def _bits(qh: np.ndarray) -> np.ndarray:
    """The bits of bytes ``[n, k]``, byte by byte, lowest first: ``[n, 8k]``."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _zero_point(d: np.ndarray, zero: int) -> tuple[np.ndarray, np.ndarray]:
    """Scales ``d`` and biases ``-zero * d`` of a zero-point type, float16
    when every bias is an fp16 (it is unless ``zero * d`` overflows fp16),
    float32 for the tensor otherwise."""
    bias = -np.float32(zero) * d.astype(np.float32)
    with np.errstate(over="ignore"):
        bias16 = bias.astype(np.float16)
    if np.array_equal(bias16.astype(np.float32), bias, equal_nan=True):
        return d, bias16
    return d.astype(np.float32), bias


def _q4_0(b):
    scales, biases = _zero_point(_f16(b, 0), 8)
    return _nibbles(b[:, 2:18]), scales, biases, 4


def _q4_1(b):
    return _nibbles(b[:, 4:20]), _f16(b, 0), _f16(b, 2), 4


def _q5_codes(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    return _nibbles(qs) | (_bits(qh) << 4)


def _q5_0(b):
    scales, biases = _zero_point(_f16(b, 0), 16)
    return _q5_codes(b[:, 2:6], b[:, 6:22]), scales, biases, 5


def _q5_1(b):
    return _q5_codes(b[:, 4:8], b[:, 8:24]), _f16(b, 0), _f16(b, 2), 5


def _q8_0(b):
    scales, biases = _zero_point(_f16(b, 0), 128)
    # Flipping the top bit of an int8 adds 128 to it, as an unsigned byte.
    return b[:, 2:34] ^ 0x80, scales, biases, 8


def _k_scales_biases(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's per-32 scales ``d * sc`` and biases ``-(dmin * m)``,
    float32 ``[blocks, 8]``, from the 6-bit ``sc``/``m`` packed in bytes
    4-15 (bytes 0-3: scales 0-3 and, in the top 2 bits, those of scales
    4-7; bytes 4-7 the same for the mins; bytes 8-11 the low 4 bits of
    scales 4-7 (low nibble) and mins 4-7 (high nibble))."""
    s = b[:, 4:16].reshape(-1, 3, 4)
    lo_sc, lo_m, mixed = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([lo_sc & 63, (mixed & 0xF) | ((lo_sc >> 2) & 0x30)], axis=-1)
    m = np.concatenate([lo_m & 63, (mixed >> 4) | ((lo_m >> 2) & 0x30)], axis=-1)
    d = _f16(b, 0).astype(np.float32)[:, None]
    dmin = _f16(b, 2).astype(np.float32)[:, None]
    return d * sc.astype(np.float32), -(dmin * m.astype(np.float32))


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 4-bit codes ``[blocks, 256]``: each run of 32 bytes holds
    64 elements, low nibbles first."""
    return _nibbles(qs.reshape(-1, 4, 32)).reshape(-1, 256)


def _q4_k(b):
    scales, biases = _k_scales_biases(b)
    return _k_nibbles(b[:, 16:144]), scales, biases, 4


def _q5_k(b):
    scales, biases = _k_scales_biases(b)
    # Bit j of qh byte i is the fifth bit of element 32 j + i.
    high = _bits(b[:, 16:48]).reshape(-1, 32, 8).transpose(0, 2, 1).reshape(-1, 256)
    return _k_nibbles(b[:, 48:176]) | (high << 4), scales, biases, 5


_RELAYOUTS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
              "Q4_K": _q4_k, "Q5_K": _q5_k}
