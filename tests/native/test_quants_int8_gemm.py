"""The int8 GEMM of the quant tables (native/src/quants/*/int8_gemm.h) over
weight rows unpacked by each type's unpack_row, on every table this CPU runs
and on the arm64 tables under qemu (quants_lib.cross_tools): every product
within float rounding of the float64 product of gguf's dequantized weights
with the activation blocks' values, and of the same table's vec_dot (the
decode step's numerics) on the same row pair; with the largest codes and
+-127 activations, no int16 or int32 sum may overflow.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import quants_lib

#: Type -> (GGUF id, block elements, activation kind, the byte offsets of its
#: fp16 fields and the low end of their random values).
TYPES = {
    "Q4_0": (2, 32, "q8_0", ((0, -1.0),)),
    "Q4_1": (3, 32, "q8_1", ((0, 0.0), (2, -1.0))),
    "Q5_0": (6, 32, "q8_0", ((0, -1.0),)),
    "Q5_1": (7, 32, "q8_1", ((0, 0.0), (2, -1.0))),
    "Q8_0": (8, 32, "q8_0", ((0, -1.0),)),
    "IQ4_NL": (20, 32, "q8_0", ((0, -1.0),)),
    "MXFP4": (39, 32, "q8_0", ()),
    "Q2_K": (10, 256, "q8_K", ((80, 0.0), (82, 0.0))),
    "Q3_K": (11, 256, "q8_K", ((108, -1.0),)),
    "Q4_K": (12, 256, "q8_K", ((0, 0.0), (2, 0.0))),
    "Q5_K": (13, 256, "q8_K", ((0, 0.0), (2, 0.0))),
    "Q6_K": (14, 256, "q8_K", ((208, -1.0),)),
    "IQ4_XS": (23, 256, "q8_K", ((0, -1.0),)),
}
#: The activation blocks (quants.h's BlockQ8_0, BlockQ8_1, BlockQ8_K).
ACTIVATIONS = {
    "q8_0": (0, np.dtype([("d", "<f4"), ("qs", "i1", 32)]), 32),
    "q8_1": (1, np.dtype([("d", "<f4"), ("s", "<f4"), ("qs", "i1", 32)]), 32),
    "q8_K": (2, np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)]), 256),
}
TABLES = quants_lib.tables()


def random_rows(name: str, rows: int, k: int, rng: np.random.Generator,
                fill: int | None = None) -> np.ndarray:
    """``rows`` rows of ``k`` elements of type ``name`` (uint8 [rows, bytes]):
    random bytes in every code and scale field (or ``fill`` there), random
    finite fp16 scales; MXFP4's E8M0 byte in 110..140."""
    type_id, block, _, fp16_fields = TYPES[name]
    size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]][1]
    n_blocks = rows * k // block
    blocks = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    if fill is not None:
        blocks[:] = fill
    if name == "MXFP4":
        blocks[:, 0] = rng.integers(110, 141, n_blocks)
    for offset, low in fp16_fields:
        values = rng.uniform(low, 1.0, n_blocks).astype(np.float16)
        blocks[:, offset:offset + 2] = values[:, None].view(np.uint8)
    return blocks.reshape(rows, -1)


def activation_rows(quants, isa: str, name: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``x`` quantized by table ``isa`` into the type's activation
    blocks: the raw bytes (rows concatenated) and the values they hold,
    float64."""
    kind, dtype, block = ACTIVATIONS[TYPES[name][2]]
    raw = np.concatenate([quants.quantize(isa, kind, row, dtype.itemsize, block) for row in x])
    blocks = raw.view(dtype)
    values = blocks["qs"].astype(np.float64) * blocks["d"].astype(np.float64)[:, None]
    return raw, values.reshape(x.shape)


def check_gemm(quants, table, name: str, w: np.ndarray, x: np.ndarray, k: int) -> None:
    """The table's int8 GEMM of weight rows ``w`` with rows ``x`` (float32)
    against float64 and against its own vec_dot, pair by pair."""
    type_id = TYPES[name][0]
    xq, x_values = activation_rows(quants, table.isa, name, x)
    got = quants.int8_gemm(table.isa, type_id, k, w, xq, len(w), len(x))
    dequantized = gguf.quants.dequantize(w, gguf.GGMLQuantizationType[name]).astype(np.float64)
    want = x_values @ dequantized.reshape(len(w), k).T
    scale = np.abs(x_values) @ np.abs(dequantized.reshape(len(w), k)).T
    # q8_1's stored sum s is fp16-rounded: the m term differs from the
    # float64 product by up to 2^-11 of |m| * |s| per block.
    slack = 2e-3 if TYPES[name][2] == "q8_1" else 1e-5
    assert np.all(np.abs(got - want) <= slack * scale + 1e-6), (str(table), name)
    act_row = len(xq) // len(x)
    for i in range(len(x)):
        for j in range(len(w)):
            single = quants.vec_dot(table.isa, type_id, k, w[j], xq[i * act_row:(i + 1) * act_row])
            assert abs(got[i, j] - single) <= 1e-5 * scale[i, j] + 1e-6, (str(table), name, i, j)


@pytest.mark.parametrize("table", TABLES, ids=str)
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("rows_x", [1, 4, 7])
def test_int8_gemm_matches_float64_and_vec_dot(quants, table, name, rows_x):
    """Random blocks (every bit pattern of the codes) and activations with
    outliers; 1, 4 and 7 rows of x (the four-row tile and the rest)."""
    rng = np.random.default_rng(100 * TYPES[name][0] + rows_x)
    k = 3 * TYPES[name][1] if TYPES[name][1] == 256 else 576
    w = random_rows(name, 5, k, rng)
    x = rng.standard_normal((rows_x, k)).astype(np.float32)
    x[:, rng.integers(0, k, k // 64)] *= 20
    check_gemm(quants, table, name, w, x, k)


@pytest.mark.parametrize("table", TABLES, ids=str)
@pytest.mark.parametrize("name", TYPES)
def test_int8_gemm_extreme_codes(quants, table, name):
    """Every code and scale byte 0x00, 0xFF, 0xAA or 0x55 against rows of
    +-1 (quantized to +-127): the sums must not saturate or wrap."""
    rng = np.random.default_rng(TYPES[name][0])
    k = 2 * TYPES[name][1] if TYPES[name][1] == 256 else 128
    for fill in (0x00, 0xFF, 0xAA, 0x55):
        w = random_rows(name, 3, k, rng, fill=fill)
        x = np.where(rng.random((5, k)) < 0.75, 1.0, -1.0).astype(np.float32)
        x[1] = 1.0
        x[2] = -1.0
        check_gemm(quants, table, name, w, x, k)
