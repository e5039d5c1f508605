"""Dequantizers of every GGML block type, written with MLX ops only.

:func:`dequantize` turns a tensor kept as the file's blocks (``uint8
[..., row_bytes]``, see :mod:`.types`) into ``float32 [..., row_elements]``.
Everything here is ``mlx.core`` arithmetic on whole arrays, so it runs in
``mx.compile`` traces and on any device; the only Python loops are over the
few fields of a block.

The results equal llama.cpp's own (``gguf.quants.dequantize``) bit for bit:
each type does its float32 products in the order llama.cpp does (``d * sc``
first, then ``* q``; ``(d * q) + m``), and its integer parts exactly.

The IQ types' codebooks and the non-linear value tables (IQ4_NL, MXFP4) are
llama.cpp's, taken from the ``gguf`` package (llama.cpp's gguf-py) when a
type first needs them and cached as ``mx.array`` constants: they are data of
the format, not ours to retype.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import mlx.core as mx
import numpy as np

from .codebooks import grid_of

from .types import BY_NAME

# A decoder sees ``b``, uint8 ``[blocks, block_bytes]`` (every block of the
# tensor, one per row), and returns float32 values of any shape
# ``[blocks, ...]`` holding ``block`` values per block, in order.
_Decoder = Callable[[mx.array], mx.array]
_DECODERS: dict[str, _Decoder] = {}


def _decoder(name: str) -> Callable[[_Decoder], _Decoder]:
    def register(fn: _Decoder) -> _Decoder:
        _DECODERS[name] = fn
        return fn
    return register


def dequantize(type_name: str, blocks: mx.array) -> mx.array:
    """The float32 values of ``blocks``, a tensor of the GGML block type
    ``type_name`` kept as its file bytes: ``uint8 [..., row_bytes]`` ->
    ``float32 [..., row_elements]``, equal to llama.cpp's dequantization bit
    for bit.

    Raises :class:`ValueError` for a name that is not a block type, a dtype
    other than uint8, or a row that is not a whole number of blocks."""
    if type_name not in _DECODERS:
        kind = "a float type, not a block type" if type_name in BY_NAME else "not a GGML type"
        raise ValueError(f"cannot dequantize {type_name!r}: {kind} "
                         f"(block types: {', '.join(_DECODERS)})")
    t = BY_NAME[type_name]
    if blocks.dtype != mx.uint8:
        raise ValueError(f"{type_name} blocks must be uint8 [..., row_bytes], got {blocks.dtype}")
    if blocks.ndim == 0:
        raise ValueError(f"{type_name} blocks must be uint8 [..., row_bytes], got a scalar")
    row_bytes = blocks.shape[-1]
    if row_bytes % t.block_bytes:
        raise ValueError(f"{type_name} row_bytes {row_bytes} is not a whole number of "
                         f"{t.block_bytes}-byte blocks")
    lead = list(blocks.shape[:-1])
    per_row = row_bytes // t.block_bytes
    out = _DECODERS[type_name](blocks.reshape(-1, t.block_bytes))
    return out.reshape(lead + [per_row * t.block])


# --- field readers -----------------------------------------------------------

def _f16(b: mx.array, at: int) -> mx.array:
    """The fp16 field at byte ``at`` of each block, as float32 ``[blocks, 1]``."""
    return b[:, at:at + 2].view(mx.float16).astype(mx.float32)


def _planes(x: mx.array, shifts: Sequence[int], mask: int) -> mx.array:
    """``(x >> s) & mask`` for each shift, stacked before the last axis:
    ``[..., n]`` -> ``[..., len(shifts), n]``. llama.cpp lays sub-byte codes
    out plane by plane: the low bits of a run of bytes are its first
    elements, the next bits the following ones."""
    s = mx.array(list(shifts), dtype=x.dtype).reshape(-1, 1)
    return (mx.expand_dims(x, -2) >> s) & mask


def _fields(x: mx.array, shifts: Sequence[int], mask: int) -> mx.array:
    """``(x >> s) & mask`` for each shift, kept next to their source:
    ``[..., n]`` -> ``[..., n, len(shifts)]`` (the packed fields of each
    byte or word in order, lowest bits first)."""
    s = mx.array(list(shifts), dtype=x.dtype)
    return (mx.expand_dims(x, -1) >> s) & mask


def _nibbles(qs: mx.array) -> mx.array:
    """The 4-bit codes of bytes ``[..., n]``: the n low nibbles, then the n
    high ones (``[..., 2n]``)."""
    return mx.concatenate([qs & 0xF, qs >> 4], axis=-1)


def _f32(q: mx.array) -> mx.array:
    return q.astype(mx.float32)


def _sign(bits: mx.array) -> mx.array:
    """+1.0 where a sign bit is clear, -1.0 where it is set (llama.cpp
    multiplies by the sign rather than negating, and so do we, so that even
    the sign of a zero agrees)."""
    return mx.where(bits == 0, 1.0, -1.0).astype(mx.float32)


# --- llama.cpp's tables, from gguf-py ----------------------------------------

def _gguf_quants(table: str):
    try:
        import gguf.quants
    except ImportError as e:
        raise ImportError(f"llama.cpp's {table} comes from the 'gguf' package "
                          "(pip install gguf)") from e
    return gguf.quants


@functools.cache
def _grid(type_name: str) -> mx.array:
    """The codebook of an IQ type (:mod:`.codebooks`), float32 ``[entries,
    width]``."""
    return mx.array(grid_of(type_name).astype(np.float32))


@functools.cache
def _kvalues(table: str) -> mx.array:
    """The 16 values a 4-bit code stands for, as float32: ``"IQ4_NL"``'s
    (IQ4_XS's too) or ``"MXFP4"``'s (its e2m1 values doubled)."""
    return mx.array(np.asarray(getattr(_gguf_quants(f"{table} values"), table).kvalues,
                               np.float32))


@functools.cache
def _ksign_table() -> mx.array:
    """The eight signs (+-1.0) of each of the 128 7-bit sign indices of the
    IQ2/IQ3 types (llama.cpp's ``ksigns``: the 7 bits plus an 8th making
    the count of minus signs even), float32 ``[128, 8]``."""
    ksigns = np.frombuffer(_gguf_quants("ksigns").IQ2_XXS.ksigns, dtype=np.uint8)
    bits = (ksigns[:, None] >> np.arange(8, dtype=np.uint8)) & 1
    return mx.array(np.where(bits == 0, 1.0, -1.0).astype(np.float32))


# --- 32-element blocks --------------------------------------------------------

def _q5_codes(qh: mx.array, qs: mx.array) -> mx.array:
    """The 5-bit codes of a Q5_0/Q5_1 block: low nibbles from ``qs`` (16
    bytes), the fifth bits from ``qh`` (32 bits, element i at bit i)."""
    high = _fields(qh, range(8), 1).reshape(-1, 32)
    return _nibbles(qs) | (high << 4)


@_decoder("Q4_0")
def _q4_0(b: mx.array) -> mx.array:
    q = _nibbles(b[:, 2:18]).astype(mx.int32) - 8
    return _f16(b, 0) * _f32(q)


@_decoder("Q4_1")
def _q4_1(b: mx.array) -> mx.array:
    return _f16(b, 0) * _f32(_nibbles(b[:, 4:20])) + _f16(b, 2)


@_decoder("Q5_0")
def _q5_0(b: mx.array) -> mx.array:
    q = _q5_codes(b[:, 2:6], b[:, 6:22]).astype(mx.int32) - 16
    return _f16(b, 0) * _f32(q)


@_decoder("Q5_1")
def _q5_1(b: mx.array) -> mx.array:
    return _f16(b, 0) * _f32(_q5_codes(b[:, 4:8], b[:, 8:24])) + _f16(b, 2)


@_decoder("Q8_0")
def _q8_0(b: mx.array) -> mx.array:
    return _f32(b[:, 2:34].view(mx.int8)) * _f16(b, 0)


@_decoder("IQ4_NL")
def _iq4_nl(b: mx.array) -> mx.array:
    return _f16(b, 0) * mx.take(_kvalues("IQ4_NL"), _nibbles(b[:, 2:18]), axis=0)


@_decoder("MXFP4")
def _mxfp4(b: mx.array) -> mx.array:
    # The scale is an e8m0 exponent e, halved because the table holds the
    # e2m1 values doubled: 2^(e-128), built from its bits as llama.cpp does
    # (e < 2 gives float32 subnormals).
    e = b[:, 0:1].astype(mx.uint32)
    bits = mx.where(e < 2, mx.array(0x00200000, mx.uint32) << e, (e - 1) << 23)
    d = bits.view(mx.float32)
    return d * mx.take(_kvalues("MXFP4"), _nibbles(b[:, 1:17]), axis=0)


# --- K-quants and IQ4_XS (256-element super-blocks) --------------------------

def _k_scale_min(scales: mx.array) -> tuple[mx.array, mx.array]:
    """The eight 6-bit scales and mins of a Q4_K/Q5_K block from its 12
    scale bytes: bytes 0-3 hold scales 0-3 (low 6 bits), 4-7 mins 0-3; bytes
    8-11 hold the low 4 bits of scales 4-7 (low nibble) and mins 4-7 (high
    nibble), whose top 2 bits are the spare top bits of bytes 0-3 / 4-7."""
    s = scales.reshape(-1, 3, 4)
    lo_sc, lo_m, mixed = s[:, 0], s[:, 1], s[:, 2]
    sc = mx.concatenate([lo_sc & 63, (mixed & 0xF) | ((lo_sc >> 2) & 0x30)], axis=-1)
    m = mx.concatenate([lo_m & 63, (mixed >> 4) | ((lo_m >> 2) & 0x30)], axis=-1)
    return sc, m


def _k_affine(b: mx.array, q: mx.array) -> mx.array:
    """Q4_K/Q5_K: ``(d * sc) * q - dmin * m`` per 32-element sub-block, for
    codes ``q`` ``[blocks, 8, 32]``."""
    sc, m = _k_scale_min(b[:, 4:16])
    d = (_f16(b, 0) * _f32(sc)).reshape(-1, 8, 1)
    dm = (_f16(b, 2) * _f32(m)).reshape(-1, 8, 1)
    return d * _f32(q) - dm


def _k_nibbles(qs: mx.array) -> mx.array:
    """The 4-bit codes of Q4_K/Q5_K's 128 bytes, ``[blocks, 8, 32]``: each
    run of 32 bytes holds 64 elements, low nibbles first."""
    return _planes(qs.reshape(-1, 4, 32), (0, 4), 0xF).reshape(-1, 8, 32)


@_decoder("Q2_K")
def _q2_k(b: mx.array) -> mx.array:
    scales = b[:, 0:16]
    dl = (_f16(b, 80) * _f32(scales & 0xF)).reshape(-1, 16, 1)
    ml = (_f16(b, 82) * _f32(scales >> 4)).reshape(-1, 16, 1)
    q = _planes(b[:, 16:80].reshape(-1, 2, 32), (0, 2, 4, 6), 3).reshape(-1, 16, 16)
    return dl * _f32(q) - ml


@_decoder("Q3_K")
def _q3_k(b: mx.array) -> mx.array:
    # 16 6-bit scales: low 4 bits in bytes 96-103 (all low nibbles, then all
    # high ones), top 2 bits in bytes 104-107 (2-bit planes).
    low = _planes(b[:, 96:104], (0, 4), 0xF).reshape(-1, 16)
    high = _planes(b[:, 104:108], (0, 2, 4, 6), 3).reshape(-1, 16)
    scales = (low | (high << 4)).astype(mx.int32) - 32
    dl = (_f16(b, 108) * _f32(scales)).reshape(-1, 16, 1)
    ql = _planes(b[:, 32:96].reshape(-1, 2, 32), (0, 2, 4, 6), 3).reshape(-1, 16, 16)
    # A clear bit of the high mask means -4 (a set one, nothing).
    hm = _planes(b[:, 0:32], range(8), 1).reshape(-1, 16, 16)
    q = ql.astype(mx.int32) - ((hm ^ 1).astype(mx.int32) << 2)
    return dl * _f32(q)


@_decoder("Q4_K")
def _q4_k(b: mx.array) -> mx.array:
    return _k_affine(b, _k_nibbles(b[:, 16:144]))


@_decoder("Q5_K")
def _q5_k(b: mx.array) -> mx.array:
    high = _planes(b[:, 16:48], range(8), 1)
    return _k_affine(b, _k_nibbles(b[:, 48:176]) | (high << 4))


@_decoder("Q6_K")
def _q6_k(b: mx.array) -> mx.array:
    d = (_f16(b, 208) * _f32(b[:, 192:208].view(mx.int8))).reshape(-1, 16, 1)
    # Each half of the block (128 elements) takes 64 bytes of low nibbles
    # (low, then high nibbles) and 32 bytes of 2-bit high parts (4 planes).
    ql = _planes(b[:, 0:128].reshape(-1, 2, 64), (0, 4), 0xF).reshape(-1, 256)
    qh = _planes(b[:, 128:192].reshape(-1, 2, 32), (0, 2, 4, 6), 3).reshape(-1, 256)
    q = (ql | (qh << 4)).astype(mx.int32) - 32
    return d * _f32(q).reshape(-1, 16, 16)


@_decoder("IQ4_XS")
def _iq4_xs(b: mx.array) -> mx.array:
    # Eight 6-bit scales: low nibbles in bytes 4-7 (two per byte, in
    # order), top 2 bits in the 16-bit word at bytes 2-3 (two per scale).
    low = _fields(b[:, 4:8], (0, 4), 0xF).reshape(-1, 8)
    high = _fields(b[:, 2:4].view(mx.uint16).reshape(-1), range(0, 16, 2), 3).astype(mx.uint8)
    scales = (low | (high << 4)).astype(mx.int32) - 32
    dl = (_f16(b, 0) * _f32(scales)).reshape(-1, 8, 1)
    q = _planes(b[:, 8:136].reshape(-1, 8, 16), (0, 4), 0xF).reshape(-1, 8, 32)
    return dl * mx.take(_kvalues("IQ4_NL"), q, axis=0)


# --- ternary types -----------------------------------------------------------

@_decoder("TQ1_0")
def _tq1_0(b: mx.array) -> mx.array:
    # Base-3 digits stored as fixed-point fractions of 256: multiplying a
    # byte by 3^k (wrapping at 256) brings digit k to the top, and
    # (x * 3) >> 8 reads it. Bytes 0-31 hold 5 digits each, 32-47 five more,
    # 48-51 four.
    def digits(x: mx.array, count: int) -> mx.array:
        pow3 = mx.array([3 ** k for k in range(count)], dtype=mx.uint8).reshape(-1, 1)
        return (mx.expand_dims(x, -2) * pow3).reshape(x.shape[0], -1)

    t = mx.concatenate([digits(b[:, 0:32], 5), digits(b[:, 32:48], 5),
                        digits(b[:, 48:52], 4)], axis=-1)
    q = ((t.astype(mx.int32) * 3) >> 8) - 1
    return _f16(b, 52) * _f32(q)


@_decoder("TQ2_0")
def _tq2_0(b: mx.array) -> mx.array:
    q = _planes(b[:, 0:64].reshape(-1, 2, 32), (0, 2, 4, 6), 3).reshape(-1, 256)
    return _f16(b, 64) * _f32(q.astype(mx.int32) - 1)


# --- IQ types with codebooks -------------------------------------------------

def _iq_scale(d: mx.array, codes: mx.array, half: float) -> mx.array:
    """IQ2/IQ3_XXS sub-block scales: ``d * (0.5 + s) * half``."""
    return d * (0.5 + _f32(codes)) * half


def _nibble_pairs(x: mx.array) -> mx.array:
    """The two 4-bit fields of each byte ``[..., n]``, in order: ``[..., 2n]``."""
    return _fields(x, (0, 4), 0xF).reshape(x.shape[0], -1)


def _ksigns_of(words: mx.array) -> mx.array:
    """The signs ``[..., 4, 8]`` of four 7-bit sign indices at bits 0, 7, 14
    and 21 of each uint32 of ``words``."""
    idx = _fields(words, (0, 7, 14, 21), 0x7F)
    return mx.take(_ksign_table(), idx, axis=0)


@_decoder("IQ2_XXS")
def _iq2_xxs(b: mx.array) -> mx.array:
    # 8 sub-blocks of 32, each two uint32: four grid indices (the bytes of
    # the first), four sign indices and a 4-bit scale (the second).
    words = b[:, 2:66].view(mx.uint32).reshape(-1, 8, 2)
    aux = words[..., 1]
    db = _iq_scale(_f16(b, 0), aux >> 28, 0.25).reshape(-1, 8, 1, 1)
    grid = mx.take(_grid("IQ2_XXS"), b[:, 2:66].reshape(-1, 8, 8)[..., 0:4], axis=0)
    return db * grid * _ksigns_of(aux)


@_decoder("IQ2_XS")
def _iq2_xs(b: mx.array) -> mx.array:
    # 32 uint16: a 9-bit grid index and a 7-bit sign index for 8 elements;
    # 16 4-bit scales, one per 16 elements.
    qs = b[:, 2:66].view(mx.uint16)
    db = _iq_scale(_f16(b, 0), _nibble_pairs(b[:, 66:74]), 0.25).reshape(-1, 16, 1, 1)
    grid = mx.take(_grid("IQ2_XS"), qs & 511, axis=0).reshape(-1, 16, 2, 8)
    signs = mx.take(_ksign_table(), qs >> 9, axis=0).reshape(-1, 16, 2, 8)
    return db * grid * signs


@_decoder("IQ2_S")
def _iq2_s(b: mx.array) -> mx.array:
    # 10-bit grid indices: low 8 bits in bytes 2-33, top 2 bits in 2-bit
    # fields of bytes 66-73; one sign bit per element in bytes 34-65.
    db = _iq_scale(_f16(b, 0), _nibble_pairs(b[:, 74:82]), 0.25).reshape(-1, 16, 1, 1)
    high = _fields(b[:, 66:74], (0, 2, 4, 6), 3).reshape(-1, 32)
    idx = b[:, 2:34].astype(mx.uint16) | (high.astype(mx.uint16) << 8)
    grid = mx.take(_grid("IQ2_S"), idx, axis=0).reshape(-1, 16, 2, 8)
    signs = _sign(_fields(b[:, 34:66], range(8), 1)).reshape(-1, 16, 2, 8)
    return db * grid * signs


@_decoder("IQ3_XXS")
def _iq3_xxs(b: mx.array) -> mx.array:
    # 64 8-bit indices of 4-value grid entries; per 32 elements a uint32
    # with four sign indices and a 4-bit scale.
    aux = b[:, 66:98].view(mx.uint32)
    db = _iq_scale(_f16(b, 0), aux >> 28, 0.5).reshape(-1, 8, 1, 1)
    grid = mx.take(_grid("IQ3_XXS"), b[:, 2:66], axis=0).reshape(-1, 8, 4, 8)
    return db * grid * _ksigns_of(aux)


@_decoder("IQ3_S")
def _iq3_s(b: mx.array) -> mx.array:
    # 9-bit indices of 4-value grid entries: low 8 bits in bytes 2-65, the
    # ninth in bytes 66-73 (bit i of byte j for index 8j + i); one sign bit
    # per element in bytes 74-105; eight 4-bit scales in 106-109.
    scales = _nibble_pairs(b[:, 106:110])
    db = (_f16(b, 0) * _f32(1 + 2 * scales)).reshape(-1, 8, 1, 1)
    high = _fields(b[:, 66:74], range(8), 1).reshape(-1, 64)
    idx = b[:, 2:66].astype(mx.uint16) | (high.astype(mx.uint16) << 8)
    grid = mx.take(_grid("IQ3_S"), idx, axis=0).reshape(-1, 8, 4, 8)
    signs = _sign(_fields(b[:, 74:106], range(8), 1)).reshape(-1, 8, 4, 8)
    return db * grid * signs


def _iq1_delta(bits: mx.array) -> mx.array:
    """IQ1's shift of a grid entry: +0.125 where the bit is clear, -0.125
    where set."""
    return mx.where(bits == 0, 0.125, -0.125).astype(mx.float32)


@_decoder("IQ1_S")
def _iq1_s(b: mx.array) -> mx.array:
    # 11-bit grid indices: low 8 bits in bytes 2-33, top 3 in four 3-bit
    # fields of the sub-block's uint16 (bytes 34-49), whose bits 12-14 are
    # its scale and bit 15 the sign of its delta.
    qh = b[:, 34:50].view(mx.uint16)
    dl = (_f16(b, 0) * _f32(2 * ((qh >> 12) & 7) + 1)).reshape(-1, 8, 1, 1)
    delta = _iq1_delta(qh & 0x8000).reshape(-1, 8, 1, 1)
    high = _fields(qh, (0, 3, 6, 9), 7).reshape(-1, 32)
    idx = b[:, 2:34].astype(mx.uint16) | (high << 8)
    grid = mx.take(_grid("IQ1_S"), idx, axis=0).reshape(-1, 8, 4, 8)
    return dl * (grid + delta)


@_decoder("IQ1_M")
def _iq1_m(b: mx.array) -> mx.array:
    # The fp16 super-block scale is spread over the top nibbles of the four
    # uint16 at bytes 48-55, whose low 12 bits are four 3-bit sub-scales.
    # 11-bit grid indices: low 8 bits in bytes 0-31, then per index a nibble
    # of bytes 32-47 holding the top 3 bits and the sign of its delta.
    words = b[:, 48:56].view(mx.uint16)
    top = (words >> 12) << mx.array([0, 4, 8, 12], dtype=mx.uint16)
    d_bits = top[:, 0:1] | top[:, 1:2] | top[:, 2:3] | top[:, 3:4]
    d = d_bits.view(mx.float16).astype(mx.float32)
    scales = _fields(words, (0, 3, 6, 9), 7).reshape(-1, 16)
    dl = (d * _f32(2 * scales + 1)).reshape(-1, 8, 2, 1, 1)
    qh = _nibble_pairs(b[:, 32:48])
    idx = b[:, 0:32].astype(mx.uint16) | ((qh & 7).astype(mx.uint16) << 8)
    delta = _iq1_delta(qh & 8).reshape(-1, 8, 2, 2, 1)
    grid = mx.take(_grid("IQ1_M"), idx, axis=0).reshape(-1, 8, 2, 2, 8)
    return dl * (grid + delta)
