"""The 32-element block types' kernels (native/src/quants/*/legacy.h: Q4_0,
Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4) and the activation quantizers and
float32 dot product (*/activations.h), on every table this CPU runs and on
the arm64 tables under qemu (without the cross tools those skip, or fail
where CI is set: quants_lib.cross_tools):

- row dequantization bit for bit equal to gguf's numpy dequantizer;
- dot products with q8_0 / q8_1 blocks within float rounding of the float64
  value llama.cpp's numerics define, and the vector tables within float
  rounding of the same machine's portable one;
- the four-row dot products (vec_dot_4, a decode step's matmul) bit for bit
  the table's one-row vec_dot, on the types each table has them for;
- q8_0 / q8_1 / q8_K codes and scales equal to numpy re-implementations of
  llama.cpp's quantizers (the portable q8_0 equal to gguf's Q8_0 quantizer).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import quants_lib

#: Name -> GGUF id of the group's types.
TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "IQ4_NL": 20, "MXFP4": 39}
#: The types dotted with q8_1 blocks (w = d * q + m: fp16 d, m at bytes 0, 2).
WITH_MIN = {"Q4_1", "Q5_1"}
QK = 32
QK_K = 256
TABLES = quants_lib.tables()
#: Row lengths: one block, a few, a realistic row (SmolLM2's hidden size).
SIZES = [32, 96, 576]


def block_bytes(name: str) -> int:
    """The bytes of one block of type ``name``."""
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]][1]


def random_blocks(name: str, n_blocks: int, rng: np.random.Generator,
                  any_finite: bool = False) -> np.ndarray:
    """``n_blocks`` blocks of type ``name``: random bytes in every code field
    (all bit patterns occur). fp16 fields: d uniform in [-1, 1] ([0, 1] where
    the format's d is a range, Q4_1/Q5_1), m in [-1, 1]; or, with
    ``any_finite``, any finite fp16 bit pattern (subnormals, large values).
    MXFP4's E8M0 byte: any value with ``any_finite``, else 100..150 (scales
    2^-27..2^23, so that no product overflows)."""
    blocks = rng.integers(0, 256, (n_blocks, block_bytes(name)), dtype=np.uint8)
    if name == "MXFP4":
        if not any_finite:
            blocks[:, 0] = rng.integers(100, 151, n_blocks)
        return blocks

    def fp16(low: float) -> np.ndarray:
        if any_finite:
            bits = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint16)
            bits[(bits & 0x7C00) == 0x7C00] &= 0x83FF  # inf/nan -> a subnormal
            return bits[:, None].view(np.uint8)
        return rng.uniform(low, 1, n_blocks).astype(np.float16)[:, None].view(np.uint8)

    blocks[:, 0:2] = fp16(0.0 if name in WITH_MIN else -1.0)
    if name in WITH_MIN:
        blocks[:, 2:4] = fp16(-1.0)
    return blocks


def reference_dequantize(name: str, blocks: np.ndarray) -> np.ndarray:
    """gguf's dequantization of ``blocks`` as one flat float32 row."""
    return gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[name]).reshape(-1)


# --- dequantization ----------------------------------------------------------


@pytest.mark.parametrize("table", TABLES, ids=str)
@pytest.mark.parametrize("name", TYPES)
def test_dequantize_matches_gguf_bit_for_bit(quants, name, table):
    rng = np.random.default_rng(TYPES[name])
    for any_finite in (False, True):
        for n_blocks in (1, 3, 64):
            blocks = random_blocks(name, n_blocks, rng, any_finite)
            got = quants.dequantize(table.isa, TYPES[name], blocks, n_blocks * QK)
            want = reference_dequantize(name, blocks)
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


# --- dot products ------------------------------------------------------------


def quantize(quants, isa: str, kind: str, x: np.ndarray) -> np.ndarray:
    """``x`` quantized by table ``isa`` into ``kind`` blocks (a record array)."""
    activation, dtype, block = quants_lib.ACTIVATIONS[kind]
    raw = quants.quantize(isa, activation, x, dtype.itemsize, block)
    return raw.view(dtype)


def reference_dot(name: str, blocks: np.ndarray, xq: np.ndarray) -> tuple[float, float]:
    """The float64 dot product llama.cpp's numerics define, and the sum of its
    terms' magnitudes (the scale of its float rounding): the dequantized
    weights times d_x * q8 codes; for Q4_1/Q5_1 the minimum's term is m * s,
    the q8_1 block's stored sum (fp16-rounded, as llama.cpp uses it)."""
    x_codes = xq["qs"].astype(np.float64)
    dx = xq["d"].astype(np.float64)[:, None]
    if name in WITH_MIN:
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float64)[:, 0]
        # d * q (up to the float rounding of gguf's d * q + m).
        scaled = reference_dequantize(name, blocks).astype(np.float64).reshape(-1, QK) - m[:, None]
        terms = np.concatenate([(scaled * dx * x_codes).ravel(), m * xq["s"].astype(np.float64)])
    else:
        w = reference_dequantize(name, blocks).astype(np.float64).reshape(-1, QK)
        terms = (w * dx * x_codes).ravel()
    return float(terms.sum()), float(np.abs(terms).sum())


def activations(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` activation values, with a few outliers as LLM activations have."""
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.integers(0, n, max(1, n // 64))] *= 20
    return x


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("table", TABLES, ids=str)
@pytest.mark.parametrize("name", TYPES)
def test_vec_dot_matches_float64_reference(quants, name, table, n):
    rng = np.random.default_rng(1000 * TYPES[name] + n)
    kind = "q8_1" if name in WITH_MIN else "q8_0"
    for _ in range(4):
        blocks = random_blocks(name, n // QK, rng)
        xq = quantize(quants, "portable", kind, activations(n, rng))
        want, scale = reference_dot(name, blocks, xq)
        got = quants.vec_dot(table.isa, TYPES[name], n, blocks, xq)
        assert abs(got - want) <= 1e-5 * scale + 1e-6, (got, want, scale)
        if table.isa != "portable":
            portable = quants.vec_dot("portable", TYPES[name], n, blocks, xq)
            assert abs(got - portable) <= 1e-5 * scale + 1e-6, (got, portable, scale)


@pytest.mark.parametrize("table", TABLES, ids=str)
@pytest.mark.parametrize("name", TYPES)
def test_vec_dot_4_equals_vec_dot_bit_for_bit(quants, name, table):
    """Four rows at once give each row's vec_dot exactly: an odd and an even
    number of blocks (the two-block step and its tail), random codes with
    outlier activations, and every code at its extremes against +-1."""
    rng = np.random.default_rng(7 * TYPES[name])
    kind = "q8_1" if name in WITH_MIN else "q8_0"
    for n in (32, 608, 576):
        for fill in [None, 0x00, 0xFF, 0x88] if n == 576 else [None]:
            blocks = np.stack([random_blocks(name, n // QK, rng) for _ in range(4)])
            x = activations(n, rng)
            if fill is not None:
                # Every byte after the scales: the codes (and Q5's high bits).
                blocks[:, :, 1 if name == "MXFP4" else 4 if name in WITH_MIN else 2:] = fill
                x = np.where(rng.random(n) < 0.5, 1.0, -1.0).astype(np.float32)
            xq = quantize(quants, table.isa, kind, x)
            quants_lib.check_vec_dot_4(quants, table, name, TYPES[name], n,
                                       blocks.reshape(4, -1), xq)


@pytest.mark.parametrize("table", TABLES, ids=str)
@pytest.mark.parametrize("name", sorted(WITH_MIN))
def test_vec_dot_with_min_approximates_dequantized_dot(quants, name, table):
    """The q8_1 types' m * s terms stand for m * d_x * sum(q8) within the
    fp16 rounding of s: the result is close to the plain dot product of the
    dequantized operands."""
    rng = np.random.default_rng(7)
    n = 576
    blocks = random_blocks(name, n // QK, rng)
    xq = quantize(quants, table.isa, "q8_1", activations(n, rng))
    x = (xq["d"][:, None].astype(np.float64) * xq["qs"]).ravel()
    w = reference_dequantize(name, blocks).astype(np.float64)
    got = quants.vec_dot(table.isa, TYPES[name], n, blocks, xq)
    assert abs(got - w @ x) <= 2e-3 * (np.abs(w) @ np.abs(x)), (got, w @ x)


@pytest.mark.parametrize("table", TABLES, ids=str)
def test_kernels_end_to_end_approximate_float_dot(quants, table):
    """A row quantized by gguf, dotted with quantized activations, is close to
    the float dot product (the whole pipeline, every type)."""
    rng = np.random.default_rng(3)
    n = 576
    w_float = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal(n).astype(np.float32)
    exact = float(w_float.astype(np.float64) @ x)
    for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"):
        blocks = gguf.quants.quantize(w_float.reshape(1, -1), gguf.GGMLQuantizationType[name])
        tolerance = {"Q8_0": 0.02, "Q5_0": 0.1, "Q5_1": 0.1}.get(name, 0.3) * np.sqrt(n)
        xq = quantize(quants, table.isa, "q8_1" if name in WITH_MIN else "q8_0", x)
        got = quants.vec_dot(table.isa, TYPES[name], n, blocks.reshape(-1), xq)
        assert abs(got - exact) <= tolerance, (name, got, exact)


# --- activation quantizers ---------------------------------------------------


def q8_0_reference(x: np.ndarray, isa: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Table ``isa``'s q8_0 quantization of ``x`` (float32) in numpy, as
    llama.cpp computes it there: the unrounded d, the stored (fp16-rounded)
    d, and the codes. The portable table is llama.cpp's reference (x / d,
    ties away from zero); the x86 tables ggml-cpu's AVX2 quantizer
    (x * (127 / amax), ties to even); the NEON one ggml-cpu's NEON quantizer
    (x / d, ties to even)."""
    blocks = x.reshape(-1, QK)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        if isa.startswith("avx2"):
            inverse = np.where(amax == 0, np.float32(0), np.float32(127) / amax)
        else:
            inverse = np.where(d == 0, np.float32(0), np.float32(1) / d)
    scaled = (blocks * inverse.astype(np.float32)).astype(np.float32)
    codes = gguf.quants.np_roundf(scaled) if isa == "portable" else np.rint(scaled)
    return d[:, 0], d[:, 0].astype(np.float16).astype(np.float32), codes.astype(np.int8)


def activation_inputs(rng: np.random.Generator, n: int) -> np.ndarray:
    """Test activations: normal values at several magnitudes, an all-zero
    block, and a block of exact ties (amax 127, so x * 127 / amax = x:
    halves round differently by the two rules)."""
    x = activations(n, rng) * np.repeat(10.0 ** rng.integers(-3, 3, n // QK), QK).astype(np.float32)
    x[QK:2 * QK] = 0
    ties = np.array([127] + [k + 0.5 for k in range(-15, 16)], np.float32)
    x[2 * QK:3 * QK] = ties
    return x.astype(np.float32)


@pytest.mark.parametrize("table", TABLES, ids=str)
def test_quantize_q8_0_matches_llama_cpp(quants, table):
    rng = np.random.default_rng(11)
    x = activation_inputs(rng, 1024)
    got = quantize(quants, table.isa, "q8_0", x)
    _, d, codes = q8_0_reference(x, table.isa)
    np.testing.assert_array_equal(got["d"], d)
    np.testing.assert_array_equal(got["qs"], codes)
    if table.isa == "portable":  # also gguf's own Q8_0 quantizer, byte for byte
        q8 = gguf.quants.quantize(x.reshape(1, -1), gguf.GGMLQuantizationType.Q8_0).reshape(-1, 34)
        np.testing.assert_array_equal(q8[:, :2].copy().view(np.float16)[:, 0].astype(np.float32),
                                      got["d"])
        np.testing.assert_array_equal(q8[:, 2:].view(np.int8), got["qs"])
    # Round trip: within half a step (plus the fp16 rounding of d).
    d_unrounded = q8_0_reference(x, "portable")[0]
    error = np.abs(got["d"][:, None] * got["qs"] - x.reshape(-1, QK))
    bound = 0.5 * d_unrounded + 127 * np.abs(got["d"] - d_unrounded) + 1e-6 * d_unrounded
    assert np.all(error <= bound[:, None] * (1 + 1e-6))


@pytest.mark.parametrize("table", TABLES, ids=str)
def test_quantize_q8_1_matches_llama_cpp(quants, table):
    rng = np.random.default_rng(12)
    x = activation_inputs(rng, 1024)
    got = quantize(quants, table.isa, "q8_1", x)
    d_unrounded, d, codes = q8_0_reference(x, table.isa)
    np.testing.assert_array_equal(got["d"], d)
    np.testing.assert_array_equal(got["qs"], codes)
    sums = codes.astype(np.int32).sum(axis=1).astype(np.float32)
    s = (sums * d_unrounded).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got["s"], s)


def q8_k_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """llama.cpp's quantize_row_q8_K_ref in numpy: d, codes, bsums."""
    blocks = x.reshape(-1, QK_K)
    peak = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], axis=1)
    with np.errstate(divide="ignore"):
        scale = np.where(peak == 0, np.float32(0), np.float32(-127) / peak).astype(np.float32)
        d = np.where(peak == 0, np.float32(0), np.float32(1) / scale).astype(np.float32)
    codes = np.minimum(127, np.rint((blocks * scale).astype(np.float32))).astype(np.int8)
    bsums = codes.reshape(-1, QK_K // 16, 16).astype(np.int16).sum(axis=2, dtype=np.int16)
    return d[:, 0], codes, bsums


@pytest.mark.parametrize("table", TABLES, ids=str)
def test_quantize_q8_k_matches_llama_cpp(quants, table):
    rng = np.random.default_rng(13)
    n = 8 * QK_K
    magnitudes = np.repeat(10.0 ** rng.integers(-3, 3, n // QK_K), QK_K).astype(np.float32)
    x = activations(n, rng) * magnitudes
    x[QK_K:2 * QK_K] = 0  # an all-zero block
    x[2 * QK_K:4 * QK_K] = rng.uniform(-1, 1, 2 * QK_K)
    x[2 * QK_K + 5], x[2 * QK_K + 9] = -50, 50  # equal magnitudes: the first sets the sign
    x[3 * QK_K + 7], x[3 * QK_K + 200] = 30, -30
    got = quantize(quants, table.isa, "q8_K", x.astype(np.float32))
    d, codes, bsums = q8_k_reference(x)
    np.testing.assert_array_equal(got["d"], d)
    np.testing.assert_array_equal(got["qs"], codes)
    np.testing.assert_array_equal(got["bsums"], bsums)
    assert got["d"][1] == 0 and not got["qs"][1].any() and not got["bsums"][1].any()
    # d = -peak / 127: the peak's code is -127, its opposite's 127.
    assert got["d"][2] > 0 and got["qs"][2][5] == -127 and got["qs"][2][9] == 127  # peak -50
    assert got["d"][3] < 0 and got["qs"][3][7] == -127 and got["qs"][3][200] == 127  # peak 30
    # Round trip: within half a step.
    error = np.abs(got["d"][:, None] * got["qs"] - x.reshape(-1, QK_K))
    assert np.all(error <= 0.5 * np.abs(got["d"])[:, None] * (1 + 1e-5) + 1e-30)


@pytest.mark.parametrize("table", TABLES, ids=str)
def test_dot_f32(quants, table):
    rng = np.random.default_rng(14)
    for n in (1, 7, 8, 37, 576, 1000):
        a = rng.standard_normal(n).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        want = float(a.astype(np.float64) @ b)
        scale = float(np.abs(a.astype(np.float64)) @ np.abs(b))
        assert abs(quants.dot_f32(table.isa, a, b) - want) <= 1e-6 * scale, n
