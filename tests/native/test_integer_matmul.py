"""The native exact integer matmul
(mlxprog/native/src/primitives/int_matmul.cpp) through its glue,
``kernels.integer_matmul``: every integer dtype on every kernel table against
numpy's integer matmul (which wraps modulo 2**bits too) and, for extreme
values, against exact Python integers reduced modulo 2**bits; mixed dtypes,
numpy's 1-D and broadcast rules, empty and K = 0 products, strided views,
compiled graphs; and the kernels alone, without MLX
(``int_matmul_selftest.cpp``, on arm64 under qemu too). Its timing against
numpy and the float64-pieces path is ``benchmarks/bench_gemm_conv.py``'s."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import kernel_tables
from quants_lib import cross_tools

from mlxprog import native
from mlxprog.arrays import AVal
from mlxprog.native import kernels

DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
# Sizes off every block size (MR 4/6, NR 4..32, MC 96, KC 256, NC 256, job
# rows 1152), the degenerate 1s, and some crossing a block boundary.
SHAPES = [(1, 1, 1), (1, 7, 1), (5, 1, 3), (7, 13, 5), (1, 300, 9), (37, 300, 41),
          (97, 257, 260), (1160, 3, 17)]


def on() -> native.Setting:
    return native.Setting(True)


def random_ints(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def exact(a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    """matmul in Python integers, reduced into ``dtype`` (two's complement)."""
    bits = np.iinfo(dtype).bits
    full = np.matmul(a.astype(object), b.astype(object))
    wrapped = np.vectorize(lambda v: v % (1 << bits), otypes=[object])(full)
    if np.iinfo(dtype).min < 0:
        wrapped = np.vectorize(lambda v: v - (1 << bits) if v >> (bits - 1) else v,
                               otypes=[object])(wrapped)
    return wrapped.astype(dtype)


def run(a, b, setting: native.Setting | None = None) -> np.ndarray:
    got = kernels.integer_matmul(setting or on(), a if isinstance(a, mx.array) else mx.array(a),
                                 b if isinstance(b, mx.array) else mx.array(b))
    assert got is not None, "the kernel declined"
    return np.array(got)


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_and_table_matches_numpy(ext, isa, dtype):
    rng = np.random.default_rng(DTYPES.index(dtype))
    for m, k, n in SHAPES:
        a, b = random_ints(rng, (m, k), dtype), random_ints(rng, (k, n), dtype)
        assert_same(run(a, b), np.matmul(a, b))


@pytest.mark.parametrize("dtype", DTYPES)
def test_extremes_wrap_exactly(ext, isa, dtype):
    info = np.iinfo(dtype)
    signed = [-1] if info.min < 0 else []
    values = np.array(sorted({info.min, info.min + 1, *signed, 0, 1, 2, info.max - 1, info.max}),
                      dtype=dtype)
    rng = np.random.default_rng(1)
    for m, k, n in [(3, 2, 4), (9, 40, 35), (13, 270, 7)]:
        a = rng.choice(values, (m, k))
        b = rng.choice(values, (k, n))
        assert_same(run(a, b), exact(a, b, dtype))
    # Every product of extremes, and sums of them that wrap several times.
    a = np.repeat(values[:, None], 600, axis=1)
    assert_same(run(a, a.T.copy()), exact(a, a.T, dtype))


@pytest.mark.parametrize("a_dtype,b_dtype", [("int8", "uint8"), ("int32", "uint32"),
                                             ("uint8", "int64"), ("int16", "uint16"),
                                             ("uint16", "uint64"), ("int8", "int32")])
def test_mixed_dtypes_promote_like_mlx(ext, a_dtype, b_dtype):
    rng = np.random.default_rng(2)
    a, b = random_ints(rng, (6, 33), a_dtype), random_ints(rng, (33, 19), b_dtype)
    dtype = mx.result_type(getattr(mx, a_dtype), getattr(mx, b_dtype))
    want_dtype = str(np.dtype(np.array(mx.zeros((1,), dtype)).dtype))
    assert_same(run(a, b), np.matmul(a.astype(want_dtype), b.astype(want_dtype)))


def test_one_d_operands_follow_numpy(ext, isa):
    rng = np.random.default_rng(3)
    v, w = random_ints(rng, (21,), "int32"), random_ints(rng, (21,), "int32")
    m = random_ints(rng, (21, 8), "int32")
    batch = random_ints(rng, (3, 5, 21), "int32")
    for a, b in [(v, m), (m.T.copy(), v), (v, w), (batch, v), (v, batch.transpose(0, 2, 1))]:
        assert_same(run(a, b), np.matmul(a, b))


def test_empty_and_zero_depth_products(ext, isa):
    for a_shape, b_shape in [((4, 0), (0, 5)), ((0, 3), (3, 5)), ((4, 3), (3, 0)),
                             ((0, 4, 3), (0, 3, 5)), ((2, 0, 3), (3, 6)), ((0,), (0,)),
                             ((3, 0), (0,))]:
        a, b = np.ones(a_shape, np.int32), np.ones(b_shape, np.int32)
        assert_same(run(a, b), np.matmul(a, b))


def test_batches_broadcast(ext, isa):
    rng = np.random.default_rng(4)
    cases = [((3, 7, 30), (3, 30, 9)), ((2, 1, 7, 30), (4, 30, 9)), ((7, 30), (4, 30, 9)),
             ((5, 7, 30), (30, 9)), ((1, 3, 1, 7, 30), (2, 1, 4, 30, 9)),
             # One B for the batch: A's matrices stack into one product.
             ((6, 1, 40), (40, 20)), ((3, 4, 5, 30), (1, 30, 9)), ((2, 3, 700, 2), (2, 5))]
    for a_shape, b_shape in cases:
        a, b = random_ints(rng, a_shape, "int16"), random_ints(rng, b_shape, "int16")
        assert_same(run(a, b), np.matmul(a, b))


def test_strided_views_need_no_copy(ext, isa):
    rng = np.random.default_rng(5)
    a = random_ints(rng, (300, 70), "int32")
    b = random_ints(rng, (40, 300), "uint32").astype(np.int32)
    a_mx, b_mx = mx.array(a), mx.array(b)
    # Transposes, a stepped slice and a broadcast, each read through its strides.
    assert_same(run(a_mx.T, b_mx.T), np.matmul(a.T, b.T))
    assert_same(run(b_mx[::3, 1::2], a_mx[1:151]), np.matmul(b[::3, 1::2], a[1:151]))
    c = random_ints(rng, (4, 70, 9), "int32")
    assert_same(run(mx.broadcast_to(a_mx[:5], (4, 5, 70)), mx.array(c)),
                np.matmul(np.broadcast_to(a[:5], (4, 5, 70)), c))
    # Rows that do not stack across the batch (a transposed batch axis).
    d = random_ints(rng, (9, 4, 70), "int32")
    assert_same(run(mx.array(d).transpose(1, 0, 2), a_mx[:70].T[:, :20]),
                np.matmul(d.transpose(1, 0, 2), a[:70].T[:, :20]))
    # One-row matrices whose batch step is not their (unused) row stride.
    e = random_ints(rng, (1, 12, 70), "int32")
    assert_same(run(mx.swapaxes(mx.array(e), 0, 1), a_mx[:70].T[:, :20]),
                np.matmul(np.swapaxes(e, 0, 1), a[:70].T[:, :20]))
    batch = random_ints(rng, (6, 8, 3), "int8")
    assert_same(run(mx.array(batch).transpose(2, 0, 1), mx.array(batch).transpose(2, 1, 0)),
                np.matmul(batch.transpose(2, 0, 1), batch.transpose(2, 1, 0)))


def test_inside_compile_and_shapeless_compile(ext):
    setting = on()
    f = mx.compile(lambda a, b: kernels.integer_matmul(setting, a, b), shapeless=True)
    rng = np.random.default_rng(6)
    for m, k, n in [(5, 9, 7), (11, 300, 3)]:
        a, b = random_ints(rng, (m, k), "int32"), random_ints(rng, (k, n), "int32")
        assert_same(np.array(f(mx.array(a), mx.array(b))), np.matmul(a, b))


def test_covers():
    i32, u64, i64 = mx.int32, mx.uint64, mx.int64
    yes = [(((3, 4), i32), ((4, 5), i32)), (((4,), mx.int8), ((4, 5), mx.uint8)),
           (((2, 1, 3, 4), i32), ((5, 4, 6), mx.uint16)), (((0, 4), i32), ((4, 5), i32)),
           (((3, 0), i64), ((0,), i64))]
    no = [(((3, 4), mx.float32), ((4, 5), i32)),  # floats: MLX's own matmul
          (((3, 4), mx.bool_), ((4, 5), mx.bool_)),
          (((3, 4), i64), ((4, 5), u64)),  # promotes to float32
          (((), i32), ((4, 5), i32)),  # 0-D
          (((3, 4), i32), ((5, 6), i32)),  # contracted sizes differ
          (((2, 3, 4), i32), ((3, 4, 5), i32))]  # batch axes do not broadcast
    for a, b in yes:
        assert kernels.covers_integer_matmul(AVal(*a), AVal(*b)), (a, b)
    for a, b in no:
        assert not kernels.covers_integer_matmul(AVal(*a), AVal(*b)), (a, b)


def test_declines_and_counts(ext):
    a, b = mx.ones((2, 3), mx.int32), mx.ones((3, 4), mx.int32)
    assert kernels.integer_matmul(native.Setting(False), a, b) is None
    assert kernels.integer_matmul(on(), a.astype(mx.float32), b) is None
    setting = on()
    kernels.integer_matmul(setting, a, b)
    kernels.integer_matmul(setting, a, b, op="dot")
    assert setting.counts == {"matmul": 1, "dot": 1}


def test_kernel_tables_by_name(ext):
    a = mx.array(np.arange(-60, 60, dtype=np.int32).reshape(10, 12))
    b = a.T
    want = np.array(a) @ np.array(b)
    for name in ext.isas():
        assert_same(np.array(ext.integer_matmul(a, b, isa=name)), want)
    with pytest.raises(ValueError, match="no kernel table"):
        ext.integer_matmul(a, b, isa="not-a-table")
    with pytest.raises(ValueError, match="one integer dtype"):
        ext.integer_matmul(a, b.astype(mx.int16))


def run_kernels_alone(compiler: str, avx2_flags: list[str], link_flags: list[str],
                      runner: list[str]) -> str:
    """Build int_matmul_selftest.cpp with the kernel tables (whose
    micro-kernels it runs) and the thread pool (once per session, see
    kernel_tables), run it, and return its output (which ends in "ok")."""
    binary = kernel_tables.selftest(compiler, Path(__file__).parent / "int_matmul_selftest.cpp",
                                    avx2_flags, link_flags)
    done = subprocess.run([*runner, str(binary)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr
    return done.stdout


def test_kernels_alone_on_the_host(ext):
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    x86 = platform.machine() in ("x86_64", "AMD64")
    out = run_kernels_alone(compiler, kernel_tables.AVX2_FLAGS if x86 else [], [], [])
    assert "portable micro-kernels: every dtype exact" in out
    # The self-test runs the AVX2 micro-kernels wherever the extension's AVX2 table runs.
    assert ("avx2 micro-kernels: every dtype exact" in out) == ("avx2" in ext.isas())


def test_kernels_alone_on_arm64_under_qemu():
    compiler, qemu = cross_tools()  # skips locally, fails under CI, without them
    out = run_kernels_alone(compiler, [], ["-static"], [qemu])
    assert "portable micro-kernels: every dtype exact" in out and "avx2" not in out


def test_every_table_and_the_float_pieces_agree_with_numpy(ext):
    """An int32 product of random full-range operands, computed by every
    kernel table and by the float64-pieces fallback, equals numpy's (the
    timings of the same are in benchmarks/bench_gemm_conv.py)."""
    from mlxprog.ops.contract import _integer_matmul

    rng = np.random.default_rng(7)
    a, b = random_ints(rng, (96, 80), "int32"), random_ints(rng, (80, 72), "int32")
    a_mx, b_mx = mx.array(a), mx.array(b)
    want = np.matmul(a, b)
    for name in ext.isas():
        ext.set_isa(name)
        try:
            assert_same(np.array(kernels.integer_matmul(on(), a_mx, b_mx)), want)
        finally:
            ext.set_isa("best")
    with mx.stream(mx.cpu):
        assert_same(np.array(_integer_matmul(a_mx, b_mx, mx.int32)), want)
