"""The int8 GEMM of the quant tables (native/src/quants/*/int8_gemm.h) over
weight rows unpacked by each type's unpack_row, on every table this CPU runs
and on the arm64 tables under qemu (quants_lib.cross_tools): every product
within float rounding of the float64 product of gguf's dequantized weights
with the activation blocks' values, and of the same table's vec_dot (the
decode step's numerics) on the same row pair; with the largest codes and
+-127 activations, no int16 or int32 sum may overflow. Each table's
unpacked form of a row is the portable one's, byte for byte.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import quants_lib
from ggml_blocks import set_iq1_m_d

from mlxprog.ggml import types as ggml_types

#: Every block type: each has an unpack_row (mlxprog.ggml.types has their
#: ids, blocks, activation kinds and fp16 fields).
TYPES = [t.name for t in ggml_types.BY_NAME.values() if t.activation is not None]
TABLES = quants_lib.tables()


@pytest.fixture(scope="module")
def machines():
    """conftest's machines, with the IQ types' codebooks set."""
    machines = quants_lib.Machines(setup=quants_lib.set_codebooks)
    yield machines
    machines.close()


def random_rows(name: str, rows: int, k: int, rng: np.random.Generator,
                fill: int | None = None) -> np.ndarray:
    """``rows`` rows of ``k`` elements of type ``name`` (uint8 [rows, bytes]):
    random bytes in every code and scale field (or ``fill`` there), every
    fp16 field (IQ1_M's spread over the top nibbles of its scale words)
    uniform in [-1, 1]; MXFP4's E8M0 byte in 110..140."""
    t = ggml_types.BY_NAME[name]
    n_blocks = rows * k // t.block
    blocks = rng.integers(0, 256, (n_blocks, t.block_bytes), dtype=np.uint8)
    if fill is not None:
        blocks[:] = fill
    if name == "MXFP4":
        blocks[:, 0] = rng.integers(110, 141, n_blocks)
    for offset in t.fp16_scales:
        values = rng.uniform(-1.0, 1.0, n_blocks).astype(np.float16)
        blocks[:, offset:offset + 2] = values[:, None].view(np.uint8)
    if name == "IQ1_M":
        set_iq1_m_d(blocks, rng.uniform(-1.0, 1.0, n_blocks).astype(np.float16))
    return blocks.reshape(rows, -1)


def activation_rows(quants, isa: str, name: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``x`` quantized by table ``isa`` into the type's activation
    blocks: the raw bytes (rows concatenated) and the values they hold,
    float64."""
    kind, dtype, block = quants_lib.ACTIVATIONS[ggml_types.BY_NAME[name].activation]
    raw = np.concatenate([quants.quantize(isa, kind, row, dtype.itemsize, block) for row in x])
    blocks = raw.view(dtype)
    values = blocks["qs"].astype(np.float64) * blocks["d"].astype(np.float64)[:, None]
    return raw, values.reshape(x.shape)


def check_gemm(quants, table, name: str, w: np.ndarray, x: np.ndarray, k: int) -> None:
    """The table's int8 GEMM of weight rows ``w`` with rows ``x`` (float32)
    against float64 and against its own vec_dot, pair by pair."""
    t = ggml_types.BY_NAME[name]
    xq, x_values = activation_rows(quants, table.isa, name, x)
    got = quants.int8_gemm(table.isa, t.id, k, w, xq, len(w), len(x))
    dequantized = gguf.quants.dequantize(w, gguf.GGMLQuantizationType[name]).astype(np.float64)
    want = x_values @ dequantized.reshape(len(w), k).T
    scale = np.abs(x_values) @ np.abs(dequantized.reshape(len(w), k)).T
    # q8_1's stored sum s is fp16-rounded: the m term differs from the
    # float64 product by up to 2^-11 of |m| * |s| per block.
    slack = 2e-3 if t.activation == "q8_1" else 1e-5
    assert np.all(np.abs(got - want) <= slack * scale + 1e-6), (str(table), name)
    act_row = len(xq) // len(x)
    for i in range(len(x)):
        for j in range(len(w)):
            single = quants.vec_dot(table.isa, t.id, k, w[j], xq[i * act_row:(i + 1) * act_row])
            assert abs(got[i, j] - single) <= 1e-5 * scale[i, j] + 1e-6, (str(table), name, i, j)


@pytest.mark.parametrize("table", TABLES, ids=str)
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("rows_x", [1, 4, 7])
@pytest.mark.parametrize("rows_w", [5, 13])
def test_int8_gemm_matches_float64_and_vec_dot(quants, table, name, rows_x, rows_w):
    """Random blocks (every bit pattern of the codes) and activations with
    outliers; 1, 4 and 7 rows of x (the four-row tile and the rest); 5 and
    13 weight rows (the 32-element types' panels of eight: one partial, one
    whole and one partial)."""
    t = ggml_types.BY_NAME[name]
    rng = np.random.default_rng(100 * t.id + rows_x + 1000 * rows_w)
    k = 3 * t.block if t.block == 256 else 576
    w = random_rows(name, rows_w, k, rng)
    x = rng.standard_normal((rows_x, k)).astype(np.float32)
    x[:, rng.integers(0, k, k // 64)] *= 20
    check_gemm(quants, table, name, w, x, k)


@pytest.mark.parametrize("table", TABLES, ids=str)
@pytest.mark.parametrize("name", TYPES)
def test_int8_gemm_extreme_codes(quants, table, name):
    """Every code and scale byte 0x00, 0xFF, 0xAA or 0x55 against rows of
    +-1 (quantized to +-127): the sums must not saturate or wrap."""
    t = ggml_types.BY_NAME[name]
    rng = np.random.default_rng(t.id)
    k = 2 * t.block if t.block == 256 else 128
    for fill in (0x00, 0xFF, 0xAA, 0x55):
        w = random_rows(name, 3, k, rng, fill=fill)
        x = np.where(rng.random((5, k)) < 0.75, 1.0, -1.0).astype(np.float32)
        x[1] = 1.0
        x[2] = -1.0
        check_gemm(quants, table, name, w, x, k)


#: The bytes of the unpacked forms (quants.h's Int8BlockK and Int8Block32).
UNPACKED_BYTES = {256: 256 + 2 * 16 + 2 * 16 + 8, 32: 32 + 8}


@pytest.mark.parametrize("table", TABLES, ids=str)
@pytest.mark.parametrize("name", TYPES)
def test_unpack_is_the_portable_form(quants, table, name):
    """A table's own unpack_row (the x86 ones store each block's codes with
    one vector) writes exactly the portable one's bytes, extreme codes
    included."""
    t = ggml_types.BY_NAME[name]
    rng = np.random.default_rng(3 * t.id)
    k = 3 * t.block if t.block == 256 else 608
    out_bytes = k // t.block * UNPACKED_BYTES[t.block]
    for fill in (None, 0x00, 0xFF):
        [row] = random_rows(name, 1, k, rng, fill=fill)
        got = quants.unpack(table.isa, t.id, k, row, out_bytes)
        want = quants.unpack("portable", t.id, k, row, out_bytes)
        np.testing.assert_array_equal(got, want, err_msg=f"{table} {name} fill={fill}")
