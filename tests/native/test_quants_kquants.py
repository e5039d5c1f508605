"""The K-quants (Q2_K .. Q6_K) and IQ4_XS kernels of every runnable table:
row dequantization bit for bit against gguf's numpy reference, the q8_K
dot products against a float64 reference on the same quantized activations,
and the four-row dot products (where a table has them) bit for bit the
one-row ones.
The arm64 tables (portable and neon+dotprod) run the same checks under qemu
(without the cross tools they skip, or fail where CI is set:
quants_lib.cross_tools).

The q8_K activation blocks are built here from random codes (not by the
library's quantizer), so these tests pin the dot products alone.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

import quants_lib

QK = 256

#: Type -> the byte offsets of its fp16 fields in a block, and whether the
#: quantizer only writes non-negative values there (d and dmin of the types
#: with mins).
FP16_FIELDS = {
    "Q2_K": ((80, 82), True),
    "Q3_K": ((108,), False),
    "Q4_K": ((0, 2), True),
    "Q5_K": ((0, 2), True),
    "Q6_K": ((208,), False),
    "IQ4_XS": ((0,), False),
}
TYPES = list(FP16_FIELDS)
TABLES = quants_lib.tables()



def type_id(name: str) -> int:
    return int(GGMLQuantizationType[name])


def random_blocks(name: str, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """n_blocks random blocks of `name` (uint8 [n_blocks, bytes]): random bytes
    for every code and scale field, random finite fp16 values for d (and dmin)."""
    size = GGML_QUANT_SIZES[GGMLQuantizationType[name]][1]
    blocks = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    offsets, non_negative = FP16_FIELDS[name]
    for offset in offsets:
        low = 0.0 if non_negative else -1.0
        values = rng.uniform(low, 1.0, n_blocks).astype(np.float16)
        blocks[:, offset:offset + 2] = values.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def fill_codes(name: str, blocks: np.ndarray, fill: int) -> None:
    """Sets every byte of `blocks` [n_blocks, bytes] but the fp16 fields
    (codes and packed scales) to `fill`."""
    code_bytes = np.ones(blocks.shape[1], bool)
    for offset in FP16_FIELDS[name][0]:
        code_bytes[offset:offset + 2] = False
    blocks[:, code_bytes] = fill


def q8k_blocks(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """q8_K blocks (raw bytes) of int8 codes [n] and one positive float per 256."""
    blocks = np.zeros(codes.size // QK, quants_lib.Q8_K)
    blocks["d"] = scales
    blocks["qs"] = codes.reshape(-1, QK)
    blocks["bsums"] = codes.reshape(-1, QK // 16, 16).astype(np.int32).sum(-1)
    return blocks.view(np.uint8)


def random_q8k(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random q8_K activations of n elements: their bytes and their values
    d * qs in float64."""
    codes = rng.integers(-127, 128, n).astype(np.int8)
    scales = rng.uniform(1e-3, 1e-1, n // QK).astype(np.float32)
    values = codes.astype(np.float64) * np.repeat(scales.astype(np.float64), QK)
    return q8k_blocks(codes, scales), values


def check_dot(quants, table: quants_lib.Table, name: str, blocks: np.ndarray, xq: np.ndarray,
              x: np.ndarray) -> None:
    """vec_dot of one row within float rounding of the float64 dot of gguf's
    dequantized weights with the activations' values, and (a vector table)
    of the result of the same machine's portable table."""
    n = x.size
    w = dequantize(blocks.reshape(1, -1), GGMLQuantizationType[name]).astype(np.float64).ravel()
    got = quants.vec_dot(table.isa, type_id(name), n, blocks, xq)
    bound = 1e-5 * float(np.abs(w) @ np.abs(x)) + 1e-6
    assert abs(got - float(w @ x)) <= bound, (str(table), name, n, got, float(w @ x), bound)
    if table.isa != "portable":
        portable = quants.vec_dot("portable", type_id(name), n, blocks, xq)
        assert abs(got - portable) <= bound, (str(table), name, n, got, portable, bound)


@pytest.mark.parametrize("table", TABLES, ids=str)
@pytest.mark.parametrize("name", TYPES)
def test_dequantize_matches_gguf(quants, table, name):
    """Rows of random blocks to float32, bit for bit as gguf's numpy."""
    rng = np.random.default_rng(1)
    rows, n = 6, 1536
    blocks = random_blocks(name, rows * n // QK, rng).reshape(rows, -1)
    want = dequantize(blocks, GGMLQuantizationType[name]).reshape(rows, n)
    for r in range(rows):
        got = quants.dequantize(table.isa, type_id(name), blocks[r], n)
        np.testing.assert_array_equal(got.view(np.uint32), want[r].view(np.uint32),
                                      err_msg=f"{table} {name} row {r}")


@pytest.mark.parametrize("table", TABLES, ids=str)
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n", [QK, 3 * QK, 2048])
def test_vec_dot_matches_float64(quants, table, name, n):
    """One block, three, and a realistic row of random blocks and codes."""
    rng = np.random.default_rng(n)
    for _ in range(4):
        blocks = random_blocks(name, n // QK, rng)
        xq, x = random_q8k(n, rng)
        check_dot(quants, table, name, blocks, xq, x)


@pytest.mark.parametrize("table", TABLES, ids=str)
@pytest.mark.parametrize("name", TYPES)
def test_vec_dot_extreme_codes(quants, table, name):
    """The largest codes and scales against +-127 activations: the int16
    pair sums and int32 block sums of the vector tables must not overflow."""
    rng = np.random.default_rng(7)
    n = 1024
    for fill in (0x00, 0xFF, 0xAA, 0x55):
        blocks = random_blocks(name, n // QK, rng)
        fill_codes(name, blocks, fill)
        for sign in (1, -1):
            codes = np.full(n, 127 * sign, np.int8)
            codes[rng.integers(0, n, n // 4)] *= -1
            xq = q8k_blocks(codes, np.full(n // QK, 0.01, np.float32))
            x = codes.astype(np.float64) * 0.01
            check_dot(quants, table, name, blocks, xq, x)



@pytest.mark.parametrize("table", TABLES, ids=str)
@pytest.mark.parametrize("name", TYPES)
def test_vec_dot_4_equals_vec_dot_bit_for_bit(quants, table, name):
    """Four rows at once give each row's vec_dot exactly: one block and a
    realistic row, random blocks and codes, and every code at its extremes
    against +-127."""
    rng = np.random.default_rng(11)
    for n in (QK, 1024):
        for fill in (None, 0x00, 0xFF):
            rows = [random_blocks(name, n // QK, rng) for _ in range(4)]
            xq, _ = random_q8k(n, rng)
            if fill is not None:
                for blocks in rows:
                    fill_codes(name, blocks, fill)
                xq = q8k_blocks(np.where(rng.random(n) < 0.5, 127, -127).astype(np.int8),
                                np.full(n // QK, 0.01, np.float32))
            quants_lib.check_vec_dot_4(quants, table, name, type_id(name), n,
                                       np.stack([b.reshape(-1) for b in rows]), xq)
