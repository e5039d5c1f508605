"""The IQ and ternary types' kernels (native/src/quants/{portable,x86,arm}/iquants.h):
row dequantization bit for bit equal to gguf's numpy dequantizer, and the dot
products with q8_K activation blocks within float rounding of the float64
dot product of the dequantized operands, on every table this CPU runs and on
the arm64 tables under qemu (without the cross tools those skip, or fail
where CI is set: quants_lib.cross_tools). The x86 tables have their own dot
products and unpackers of the grid and ternary types, and so has the
arm64 one; the row dequantizers resolve to the portable kernels, which the
tests check too."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import quants_lib
from ggml_blocks import set_iq1_m_d
from mlxprog.ggml.codebooks import CODEBOOKS, codebooks

#: Name -> GGUF id of the group's types (all 256-weight super-blocks).
TYPES = {"IQ2_XXS": 16, "IQ2_XS": 17, "IQ3_XXS": 18, "IQ1_S": 19, "IQ3_S": 21, "IQ2_S": 22,
         "IQ1_M": 29, "TQ1_0": 34, "TQ2_0": 35}
#: Byte offset of each type's fp16 d (IQ1_M's d is spread over its scale words).
D_OFFSET = {"IQ2_XXS": 0, "IQ2_XS": 0, "IQ3_XXS": 0, "IQ1_S": 0, "IQ3_S": 0, "IQ2_S": 0,
            "TQ1_0": 52, "TQ2_0": 64}
QK_K = 256
TABLES = quants_lib.tables()


@pytest.fixture(scope="module")
def machines():
    """conftest's machines, with every codebook set (the quants fixture
    picks from these)."""
    machines = quants_lib.Machines(setup=quants_lib.set_codebooks)
    yield machines
    machines.close()


def qtype(name: str) -> gguf.GGMLQuantizationType:
    """gguf's enum member of type ``name``."""
    return gguf.GGMLQuantizationType[name]


def random_blocks(name: str, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """``n_blocks`` blocks of type ``name``: random bytes in every code field
    (all bit patterns occur), finite fp16 d uniform in [-1, 1]."""
    block_bytes = gguf.GGML_QUANT_SIZES[qtype(name)][1]
    blocks = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
    d = rng.uniform(-1, 1, n_blocks).astype(np.float16)
    if name == "IQ1_M":
        set_iq1_m_d(blocks, d)
    else:
        blocks[:, D_OFFSET[name]:D_OFFSET[name] + 2] = d.view(np.uint16)[:, None].view(np.uint8)
    return blocks


def random_q8_k(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` activations as q8_K blocks: random codes in [-127, 127], random
    positive d, the per-16 sums of the codes."""
    x = np.zeros(n // QK_K, quants_lib.Q8_K)
    x["d"] = rng.uniform(1e-3, 5e-2, x.size)
    x["qs"] = rng.integers(-127, 128, (x.size, QK_K))
    x["bsums"] = x["qs"].reshape(x.size, -1, 16).astype(np.int32).sum(-1)
    return x


def test_codebooks_layout():
    """codebooks() gives each documented grid in its documented shape and
    dtype, and gguf's grids have the documented value sets."""
    books = codebooks()
    assert set(books) == set(CODEBOOKS)
    values = {"iq2xxs_grid": [8, 25, 43], "iq2xs_grid": [8, 25, 43], "iq2s_grid": [8, 25, 43],
              "iq3xxs_grid": [4, 12, 20, 28, 36, 44, 52, 62], "iq3s_grid": list(range(1, 16, 2)),
              "iq1s_grid": [-1, 0, 1]}
    for name, (_, shape, dtype) in CODEBOOKS.items():
        grid = books[name]
        assert grid.shape == shape and grid.dtype == dtype and grid.flags.c_contiguous
        assert np.unique(grid).tolist() == values[name]


def test_sign_rule_matches_gguf():
    """The kernels compute ksigns (7 bits plus their parity): gguf's table
    follows that rule."""
    ksigns = np.frombuffer(gguf.quants.IQ2_XXS.ksigns, np.uint8)
    index = np.arange(128)
    parity = np.array([bin(i).count("1") & 1 for i in index])
    assert np.array_equal(ksigns, index | (parity << 7))


@pytest.mark.parametrize("table", TABLES, ids=str)
@pytest.mark.parametrize("name", TYPES)
def test_dequantize_bit_exact(quants, name, table):
    """Rows of random blocks dequantize to gguf's float32 values bit for bit
    (2048 blocks: every grid index, sign pattern and scale occurs, with
    overwhelming probability, e.g. 65536 draws of IQ1_S's 2048 indices)."""
    rng = np.random.default_rng(TYPES[name])
    blocks = random_blocks(name, 2048, rng)
    ref = gguf.quants.dequantize(blocks, qtype(name)).reshape(-1)
    got = quants.dequantize(table.isa, TYPES[name], blocks, blocks.shape[0] * QK_K)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))
    for row in np.split(blocks[:32], 4):  # rows of 8 blocks, one call each
        got = quants.dequantize(table.isa, TYPES[name], row, row.shape[0] * QK_K)
        ref = gguf.quants.dequantize(row, qtype(name)).reshape(-1)
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("table", TABLES, ids=str)
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n", [QK_K, 4 * QK_K, 2048, 6144])
def test_vec_dot(quants, name, table, n):
    """vec_dot is within float rounding of the float64 dot product of the
    dequantized weights with the activations d * qs, and equals the same
    machine's portable table's."""
    rng = np.random.default_rng(n + TYPES[name])
    for _ in range(4):
        w = random_blocks(name, n // QK_K, rng)
        x = random_q8_k(n, rng)
        w64 = gguf.quants.dequantize(w, qtype(name)).reshape(-1).astype(np.float64)
        x64 = (x["d"].astype(np.float64)[:, None] * x["qs"]).reshape(-1)
        ref = float(w64 @ x64)
        bound = float(np.abs(w64) @ np.abs(x64))
        got = quants.vec_dot(table.isa, TYPES[name], n, w, x.view(np.uint8))
        assert abs(got - ref) <= 1e-5 * bound + 1e-6, (got, ref, bound)
        if table.isa != "portable":
            portable = quants.vec_dot("portable", TYPES[name], n, w, x.view(np.uint8))
            assert abs(got - portable) <= 1e-6 * bound + 1e-6


@pytest.mark.parametrize("table", TABLES, ids=str)
@pytest.mark.parametrize("name", TYPES)
def test_vec_dot_extreme_codes(quants, name, table):
    """Activation codes at +-127 with the signs of the weights (the largest
    integer sums the codes allow): still within float rounding."""
    rng = np.random.default_rng(7)
    w = random_blocks(name, 8, rng)
    w64 = gguf.quants.dequantize(w, qtype(name)).reshape(-1).astype(np.float64)
    x = np.zeros(8, quants_lib.Q8_K)
    x["d"] = 1.0
    x["qs"] = np.where(w64.reshape(8, QK_K) >= 0, 127, -127)
    x["bsums"] = x["qs"].reshape(8, -1, 16).astype(np.int32).sum(-1)
    x64 = x["qs"].reshape(-1).astype(np.float64)
    ref = float(w64 @ x64)
    got = quants.vec_dot(table.isa, TYPES[name], 8 * QK_K, w, x.view(np.uint8))
    assert abs(got - ref) <= 1e-5 * float(np.abs(w64) @ np.abs(x64)) + 1e-6


def test_set_codebook_refuses_unknown_names_and_wrong_sizes(machines):
    """A codebook reaches the kernels only under a known name and at its
    size (the kernels index it without bounds): anything else is refused."""
    host = machines["host"]
    grid = np.ascontiguousarray(codebooks()["iq3s_grid"])
    for name, data in (("iq3s_grid", grid.view(np.uint8)[:-4]), ("iq3s", grid), ("", grid)):
        rc, _ = host.call("set_codebook", name, 0, 0, data, np.empty(0), 0)
        assert rc != 0, name
    rc, _ = host.call("set_codebook", "iq3s_grid", 0, 0, grid, np.empty(0), 0)
    assert rc == 0
