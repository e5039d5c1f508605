"""Quantization ops: round trips, quantized matmuls against dequantized
references, gathered matmuls against per-row references; compiled programs."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from helpers import assert_close, run_op

# Every op here runs with native CPU kernels and with MLX's ops (conftest.py).
pytestmark = pytest.mark.usefixtures("native_and_mlx_ops")

RNG = np.random.default_rng(0)
TOL = {"rtol": 1e-3, "atol": 1e-3}
MODES = ["affine", "mxfp4", "mxfp8", "nvfp4"]


def _matrix(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _np(array: mx.array) -> np.ndarray:
    return np.array(array.astype(mx.float32))


@pytest.mark.parametrize(("bits", "group_size"), [(4, 64), (8, 32), (3, 128), (2, 32)])
def test_affine_round_trip_error_is_within_one_step(bits, group_size):
    w = _matrix(8, 256)
    packed, scales, biases = run_op("quantize", w, bits=bits, group_size=group_size)
    assert packed.dtype == mx.uint32 and packed.shape == (8, 256 * bits // 32)
    assert scales.shape == biases.shape == (8, 256 // group_size)
    restored = run_op("dequantize", packed, scales, biases, bits=bits, group_size=group_size)
    assert restored.dtype == mx.float32 and restored.shape == w.shape
    # Rounding costs half a step; MLX shifts the grid so that 0 is exact, which
    # can cost up to one step at the edges of a group.
    step = np.repeat(np.abs(_np(scales)), group_size, axis=-1)
    assert np.all(np.abs(_np(restored) - w) <= step + 1e-5)


@pytest.mark.parametrize(("mode", "rel_error"),
                         [("mxfp4", 0.2), ("mxfp8", 0.05), ("nvfp4", 0.2)])
def test_float_mode_round_trip(mode, rel_error):
    w = _matrix(2, 4, 64)
    parts = run_op("quantize", w, mode=mode)
    assert len(parts) == 2
    restored = _np(run_op("dequantize", *parts, mode=mode, dtype="float32"))
    assert restored.shape == w.shape
    assert np.mean(np.abs(restored - w)) / np.mean(np.abs(w)) < rel_error


def test_quantize_eager_matches_mlx():
    w = _matrix(4, 64)
    parts = run_op("quantize", w, group_size=32, eager=True)
    for got, want in zip(parts, mx.quantize(mx.array(w), group_size=32)):
        np.testing.assert_array_equal(np.array(got), np.array(want))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transpose", [True, False])
def test_quantized_matmul_equals_dequantized_matmul(mode, transpose):
    # Quantized along the last axis: (out, in) with transpose, else (in, out).
    w = _matrix(32, 64) if transpose else _matrix(64, 128)
    parts = run_op("quantize", w, mode=mode)
    deq = _np(run_op("dequantize", *parts, mode=mode))
    x = _matrix(2, 3, 64)
    expected = x @ (deq.T if transpose else deq)
    got = run_op("quantized_matmul", x, *parts, mode=mode, transpose=transpose)
    assert_close(got, expected, dtype=mx.float32, **TOL)


def _experts(n: int, out_dim: int, in_dim: int, bits: int = 4):
    w = _matrix(n, out_dim, in_dim)
    parts = run_op("quantize", w, bits=bits, group_size=32)
    deq = _np(run_op("dequantize", *parts, bits=bits, group_size=32))
    return parts, deq


def test_gather_qmm_with_rhs_indices_picks_one_expert_per_row():
    parts, deq = _experts(4, 16, 64)
    x = _matrix(6, 1, 64)
    experts = np.array([3, 0, 1, 1, 2, 0], dtype=np.uint32)
    got = run_op("gather_qmm", x, *parts, experts, rhs_indices=True, group_size=32)
    expected = np.stack([x[i] @ deq[e].T for i, e in enumerate(experts)])
    assert_close(got, expected, **TOL)


def test_gather_qmm_with_both_indices_and_mxfp4():
    w = _matrix(3, 16, 64)
    packed, scales = run_op("quantize", w, mode="mxfp4")
    deq = _np(run_op("dequantize", packed, scales, mode="mxfp4"))
    x = _matrix(5, 2, 64)
    rows = np.array([4, 4, 0, 2], dtype=np.int32)
    experts = np.array([0, 2, 2, 1], dtype=np.int32)
    got = run_op("gather_qmm", x, packed, scales, rows, experts, mode="mxfp4",
                 lhs_indices=True, rhs_indices=True)
    expected = np.stack([x[r] @ deq[e].T for r, e in zip(rows, experts)])
    assert_close(got, expected, **TOL)


def test_gather_qmm_untransposed_with_sorted_indices():
    parts, deq = _experts(3, 64, 32, bits=8)
    x = _matrix(4, 1, 64)
    experts = np.array([0, 0, 1, 2], dtype=np.uint32)
    got = run_op("gather_qmm", x, *parts, experts, rhs_indices=True, transpose=False,
                 sorted_indices=True, bits=8, group_size=32)
    expected = np.stack([x[i] @ deq[e] for i, e in enumerate(experts)])
    assert_close(got, expected, **TOL)


@pytest.mark.parametrize(("lhs", "rhs"), [(False, True), (True, False), (True, True)])
def test_gather_mm_matches_per_row_reference(lhs, rhs):
    # An absent index operand means batch entry i for output i (MLX's None).
    rows = np.array([3, 1, 0, 0, 2], np.uint32) if lhs else np.arange(5)
    cols = np.array([2, 2, 1, 0, 1], np.uint32) if rhs else np.arange(5)
    a = _matrix(4 if lhs else 5, 2, 8)
    b = _matrix(3 if rhs else 5, 8, 5)
    indices = [i for i, given in ((rows, lhs), (cols, rhs)) if given]
    got = run_op("gather_mm", a, b, *indices, lhs_indices=lhs, rhs_indices=rhs)
    expected = np.stack([a[r] @ b[c] for r, c in zip(rows, cols)])
    assert_close(got, expected, **TOL)


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint64])
def test_gathered_matmul_indices_are_clamped(dtype, eager):
    # MLX reads outside the experts (garbage, or a crash) at out-of-range indices.
    parts, deq = _experts(3, 16, 64)
    b = _matrix(3, 64, 16)
    x = _matrix(4, 1, 64)
    big = 2**64 - 1 if dtype == np.uint64 else np.iinfo(dtype).max
    experts = np.array([big, 3, 1, 0], dtype)
    if dtype != np.uint64:
        experts[3] = -1  # counts from the end
    picked = [2, 2, 1, 0 if dtype == np.uint64 else 2]
    got = run_op("gather_qmm", x, *parts, experts, rhs_indices=True, group_size=32,
                 eager=eager)
    assert_close(got, np.stack([x[i] @ deq[e].T for i, e in enumerate(picked)]), **TOL)
    got = run_op("gather_mm", x, b, experts, rhs_indices=True, eager=eager)
    assert_close(got, np.stack([x[i] @ b[e] for i, e in enumerate(picked)]), **TOL)
    rows = np.array([5, -7, 0, 2], np.int64)  # x has 4 rows: clamped to 3, 0, 0, 2
    got = run_op("gather_mm", x, b[:1], rows, lhs_indices=True, eager=eager)
    assert_close(got, np.stack([x[r] @ b[0] for r in [3, 0, 0, 2]]), **TOL)


def test_gather_mm_eager():
    a, b = _matrix(3, 1, 4), _matrix(2, 4, 6)
    experts = np.array([1, 0, 1], dtype=np.int32)
    got = run_op("gather_mm", a, b, experts, rhs_indices=True, eager=True)
    assert_close(got, np.stack([a[i] @ b[e] for i, e in enumerate(experts)]), **TOL)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_quantize_group_with_nan_dequantizes_to_nan_compiled_and_eager(mode, dtype):
    # MLX alone gives mxfp4 scales 127 compiled and 0 eager for bfloat16 NaN.
    group = 16 if mode == "nvfp4" else 64 if mode == "affine" else 32
    w = mx.array(_matrix(3, 128)).astype(getattr(mx, dtype))
    w[0, 3] = float("nan")
    w[1, group:] = float("nan")
    compiled = run_op("quantize", w, mode=mode)
    eager = run_op("quantize", w, mode=mode, eager=True)
    for got, want in zip(compiled, eager):
        np.testing.assert_array_equal(_np(got), _np(want))
    restored = _np(run_op("dequantize", *compiled, mode=mode, dtype="float32"))
    nan_groups = np.zeros((3, 128), bool)
    nan_groups[0, :group] = nan_groups[1, group:] = True
    np.testing.assert_array_equal(np.isnan(restored), nan_groups)
    clean = run_op("quantize", mx.where(mx.isnan(w), 0, w), mode=mode)
    expected = _np(run_op("dequantize", *clean, mode=mode, dtype="float32"))
    np.testing.assert_array_equal(restored[~nan_groups], expected[~nan_groups])
    x = np.ones((1, 128), np.float32)
    product = _np(run_op("quantized_matmul", x, *compiled, mode=mode))
    np.testing.assert_array_equal(np.isnan(product), [[True, True, False]])


W = _matrix(8, 64)
AFFINE = [np.array(p) for p in mx.quantize(mx.array(W))]
MXFP4 = [np.array(p) for p in mx.quantize(mx.array(W), mode="mxfp4")]
NO_EXPERTS = mx.quantize(mx.zeros((0, 8, 64)))


def _f64(array: np.ndarray) -> mx.array:
    """A float64 array (numpy float64 operands would become float32)."""
    return mx.array(array, mx.float64)


@pytest.mark.parametrize(
    ("op", "operands", "attrs", "message"),
    [
        ("quantize", [W], {"bits": 7}, "mode 'affine' supports bits 1, 2, 3, 4, 5, 6, 8; found 7"),
        ("quantize", [W], {"group_size": 16}, "supports group_size 32, 64, 128; found 16"),
        ("quantize", [W], {"mode": "mxfp4", "group_size": 64}, "supports group_size 32"),
        ("quantize", [W], {"mode": "nvfp4", "bits": 8}, "supports bits 4; found 8"),
        ("quantize", [W], {"mode": "int4"}, "'mode'"),
        ("quantize", [W[0]], {}, "at least 2 dimension"),
        ("quantize", [W[:, :48]], {}, "divisible by the quantization group size 64"),
        ("dequantize", AFFINE[:2], {}, "operands are (w, scales, biases): 3 expected, found 2"),
        ("dequantize", MXFP4 + AFFINE[2:], {"mode": "mxfp4"}, "(w, scales): 2 expected"),
        ("quantized_matmul", [W[:, :32], *AFFINE], {}, "does not match"),
        ("quantized_matmul", [W, *AFFINE], {"bits": 8}, "incompatible"),
        ("gather_qmm", [W, *AFFINE, np.zeros(8, np.uint32)], {},
         "(x, w, scales, biases): 4 expected, found 5"),
        ("gather_mm", [W, W.T], {"rhs_indices": True}, "(a, b, rhs_indices): 3 expected"),
        ("gather_mm", [W[:, None], W.T[None], np.zeros(8, np.float32)], {"rhs_indices": True},
         "rhs_indices must have an integer dtype; found float32[8]"),
        ("gather_mm", [W[:, None], np.zeros((0, 64, 8), np.float32), np.zeros(2, np.int32)],
         {"rhs_indices": True}, "rhs_indices picks from the batch axes [0] of b, which hold "
                                "no matrix; found int32[2]"),
        ("gather_qmm", [W[:, None], *NO_EXPERTS, np.zeros(2, np.int32)], {"rhs_indices": True},
         "rhs_indices picks from the batch axes [0] of w"),
        # float64 fails at evaluation in MLX (or, for mxfp8 and nvfp4, gives wrong values).
        ("quantize", [_f64(W)], {}, "w must be float16, bfloat16, float32; "
         "found float64[8, 64]"),
        ("quantize", [_f64(W)], {"mode": "mxfp8"}, "w must be float16"),
        ("quantize", [W.astype(np.int32)], {}, "w must be float16"),
        ("dequantize", MXFP4, {"mode": "nvfp4", "dtype": "float64"},
         "dtype must be float16, bfloat16, float32 (or null); found float64"),
        ("dequantize", [AFFINE[0], _f64(AFFINE[1]), AFFINE[2]], {},
         "scales is float64, which MLX's quantization kernels do not support"),
        ("quantized_matmul", [_f64(W), *AFFINE], {}, "x is float64"),
        ("quantized_matmul", [W, *AFFINE[:2], _f64(AFFINE[2])], {},
         "biases is float64"),
        ("quantized_matmul", [_f64(W), *MXFP4], {"mode": "mxfp4"}, "x is float64"),
        ("gather_qmm", [_f64(W), *AFFINE], {}, "x is float64"),
    ],
)
def test_invalid_attrs_and_operands(op, operands, attrs, message):
    with pytest.raises(mp.ValidationError, match="instruction 0") as err:
        run_op(op, *operands, **attrs)
    assert message in str(err.value)
