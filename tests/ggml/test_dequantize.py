"""mlxprog.ggml.dequantize against llama.cpp's own dequantizers (gguf-py's
``gguf.quants.dequantize``), bit for bit, for every block type of the type
table: eagerly, inside ``mx.compile``, and with batch axes."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from mlxprog.ggml.dequantize import dequantize
from mlxprog.ggml.types import BY_NAME

BLOCK_TYPES = [t.name for t in BY_NAME.values() if t.storage != "float"]

#: Byte offsets of each type's fp16 fields in a block (IQ1_M spreads its
#: scale over four words: see _scale_bytes; MXFP4's is an e8m0 byte, any
#: value valid).
FP16_FIELDS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ4_NL": (0,), "IQ4_XS": (0,), "MXFP4": (), "IQ1_S": (0,), "IQ1_M": (),
    "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,),
    "TQ1_0": (52,), "TQ2_0": (64,),
}


def _fp16_values(rng: np.random.Generator, n: int) -> np.ndarray:
    """n finite fp16 scales: uniform in [-2, 2], the first ones replaced by
    +0, -0 and fp16 subnormals (edge cases of the sign and of the
    conversion)."""
    d = rng.uniform(-2, 2, size=n).astype(np.float16)
    edge = np.array([0.0, -0.0, 2.0 ** -20, -(2.0 ** -24)], dtype=np.float16)
    d[:min(n, edge.size)] = edge[:n]
    return rng.permutation(d)


def _scale_bytes(name: str) -> set[int]:
    """The byte offsets of a block's fp16 scale (IQ1_M: the four uint16 at
    bytes 48-55 whose top nibbles hold it)."""
    if name == "IQ1_M":
        return set(range(48, 56))
    return {at + i for at in FP16_FIELDS[name] for i in (0, 1)}


def _code_bytes(name: str) -> list[int]:
    """The byte offsets of a block that hold codes, sub-scales and other
    bit fields: every one but the scale's."""
    return [i for i in range(BY_NAME[name].block_bytes) if i not in _scale_bytes(name)]


def _blocks(name: str, rows: int, per_row: int, seed: int = 0) -> np.ndarray:
    """A valid ``uint8 [rows, row_bytes]`` tensor of type ``name``: its
    code bytes a shuffle of every byte value (each appears once the tensor
    has 256 of them), its fp16 scales finite."""
    t = BY_NAME[name]
    rng = np.random.default_rng(seed)
    n = rows * per_row
    b = np.zeros((n, t.block_bytes), dtype=np.uint8)
    codes = _code_bytes(name)
    every = np.resize(np.arange(256, dtype=np.uint8), n * len(codes))
    b[:, codes] = rng.permutation(every).reshape(n, len(codes))
    for at in FP16_FIELDS[name]:
        b[:, at:at + 2] = _fp16_values(rng, n).view(np.uint8).reshape(n, 2)
    if name == "IQ1_M":
        # The scale's 16 bits are the top nibbles of the uint16 at bytes
        # 48, 50, 52, 54 (lowest nibble first); their low 12 bits are four
        # 3-bit sub-scales, random.
        low = rng.integers(0, 1 << 12, size=(n, 4), dtype=np.uint16)
        d = _fp16_values(rng, n).view(np.uint16)[:, None]
        nibbles = (d >> (4 * np.arange(4, dtype=np.uint16))) & 0xF
        b[:, 48:56] = (low | (nibbles << 12)).astype("<u2").view(np.uint8)
    return b.reshape(rows, per_row * t.block_bytes)


def _shape(name: str) -> tuple[int, int]:
    """Rows and blocks per row: enough blocks that the code bytes hold
    every byte value."""
    return (4, 4) if BY_NAME[name].block == 32 else (3, 2)


def _reference(name: str, raw: np.ndarray) -> np.ndarray:
    # MXFP4's largest exponents overflow to inf in llama.cpp too.
    with np.errstate(over="ignore"):
        return gguf_dequantize(raw, GGMLQuantizationType[name])


def _assert_bits_equal(out: mx.array, ref: np.ndarray) -> None:
    got = np.array(out)
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_every_block_type_is_covered():
    assert set(FP16_FIELDS) == set(BLOCK_TYPES)


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_equals_llama_cpp_bit_for_bit(name):
    raw = _blocks(name, *_shape(name))
    ref = _reference(name, raw)
    assert not np.isnan(ref).any()
    x = mx.array(raw)
    _assert_bits_equal(dequantize(name, x), ref)
    _assert_bits_equal(mx.compile(lambda a: dequantize(name, a))(x), ref)


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_batch_axes(name):
    t = BY_NAME[name]
    raw = _blocks(name, 6, 2, seed=1).reshape(2, 3, 2 * t.block_bytes)
    out = dequantize(name, mx.array(raw))
    assert out.shape == (2, 3, 2 * t.block)
    _assert_bits_equal(out, _reference(name, raw))


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_every_code_byte_appears(name):
    raw = _blocks(name, *_shape(name))
    codes = raw.reshape(-1, BY_NAME[name].block_bytes)[:, _code_bytes(name)]
    assert np.unique(codes).size == 256


@pytest.mark.parametrize("name, blocks, match", [
    ("F16", np.zeros((1, 2), np.uint8), "float type"),
    ("Q9_9", np.zeros((1, 18), np.uint8), "not a GGML type"),
    ("Q4_0", np.zeros((1, 20), np.uint8), "Q4_0 row_bytes 20 is not a whole number"),
    ("Q4_K", np.zeros((2, 144), np.int8), "Q4_K blocks must be uint8"),
])
def test_errors(name, blocks, match):
    with pytest.raises(ValueError, match=match):
        dequantize(name, mx.array(blocks))
