"""The native CPU kernels (mlxprog/native): each kernel against MLX's own op
and an exact float64 reference, on both instruction-set paths; dispatch from
programs; the build cache and the fallback when the extension is missing."""

from __future__ import annotations

import threading
import warnings

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from mlxprog import native
from mlxprog.native import build, kernels
from quants_lib import cross_tools

DTYPES = [mx.float32, mx.float16, mx.bfloat16]
# Tolerances relative to the largest reference value: float32 allows for
# summation order; half types for the rounding of inputs and outputs.
RTOL = {mx.float32: 2e-5, mx.float16: 4e-3, mx.bfloat16: 3e-2}


def f64(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32)).astype(np.float64)


def assert_near(got: mx.array, want: np.ndarray, dtype) -> None:
    scale = max(np.abs(want).max(), 1e-6)
    err = np.abs(f64(got) - want).max() / scale
    assert err <= RTOL[dtype], f"relative error {err:.2e} > {RTOL[dtype]:.0e}"


def quantized(rng, shape, dtype, group_size, bits):
    w = mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)
    return mx.quantize(w, group_size=group_size, bits=bits)


# -- quantized matmul ----------------------------------------------------------------


@pytest.mark.parametrize("transpose", [True, False])
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 8])
def test_qmm_matches_mlx(ext, isa, bits, transpose):
    rng = np.random.default_rng(bits)
    for group_size in (32, 64, 128):
        for dtype in DTYPES:
            # 5 and 8 rows take the batched path (weights dequantized once
            # for all rows); 131 output columns (transposed), its tail of
            # single weight rows. From 8 rows on a transposed product runs
            # the float GEMM on dequantized panels of 128 weight rows: 300
            # columns are two whole panels and a part.
            for rows, N in ((1, 128), (2, 128), (5, 131 if transpose else 128), (8, 128),
                            (40, 300 if transpose else 128)):
                K = 256
                w, scales, biases = quantized(rng, (N, K) if transpose else (K, N), dtype,
                                              group_size, bits)
                x = mx.array(rng.standard_normal((rows, K)).astype(np.float32)).astype(dtype)
                got = ext.quantized_matmul(x, w, scales, biases, transpose=transpose,
                                           group_size=group_size, bits=bits)
                ref = mx.quantized_matmul(x, w, scales, biases, transpose=transpose,
                                          group_size=group_size, bits=bits)
                assert got.shape == ref.shape and got.dtype == ref.dtype
                dense = f64(mx.dequantize(w, scales, biases, group_size=group_size, bits=bits))
                exact = f64(x) @ (dense.T if transpose else dense)
                assert_near(got, exact, dtype)
                # MLX rounds more in half types (bf16 accumulates in bf16).
                scale = np.abs(exact).max()
                assert np.abs(f64(got) - f64(ref)).max() <= 4 * RTOL[dtype] * scale


@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("scale_dtype", DTYPES)
def test_qmm_mixed_dtypes_promote_like_mlx(ext, x_dtype, scale_dtype):
    rng = np.random.default_rng(0)
    w, scales, biases = quantized(rng, (64, 128), scale_dtype, 64, 4)
    x = mx.array(rng.standard_normal((3, 128)).astype(np.float32)).astype(x_dtype)
    got = ext.quantized_matmul(x, w, scales, biases, transpose=True, group_size=64, bits=4)
    ref = mx.quantized_matmul(x, w, scales, biases, group_size=64, bits=4)
    assert got.dtype == ref.dtype
    worst = DTYPES[max(DTYPES.index(x_dtype), DTYPES.index(scale_dtype))]
    assert_near(got, f64(ref), worst)


@pytest.mark.parametrize("shape", [(1, 1, 96), (2, 3, 96), (2, 1, 4, 96), (7, 96), (1, 96)])
def test_qmm_batch_dims_and_odd_sizes(ext, isa, shape):
    rng = np.random.default_rng(1)
    for n in (1, 3, 4, 5, 33):
        w, scales, biases = quantized(rng, (n, 96), mx.float32, 32, 4)
        x = mx.array(rng.standard_normal(shape).astype(np.float32))
        got = ext.quantized_matmul(x, w, scales, biases, transpose=True, group_size=32, bits=4)
        ref = mx.quantized_matmul(x, w, scales, biases, group_size=32, bits=4)
        assert got.shape == ref.shape == (*shape[:-1], n)
        assert_near(got, f64(ref), mx.float32)


def test_qmm_non_contiguous_inputs(ext, isa):
    rng = np.random.default_rng(2)
    w, scales, biases = quantized(rng, (64, 128), mx.float32, 32, 4)
    base = mx.array(rng.standard_normal((6, 128, 4)).astype(np.float32))
    views = [
        base.transpose(0, 2, 1)[:, :3],                # strided, last axis not dense
        mx.array(rng.standard_normal((8, 128)).astype(np.float32))[::2],  # row stride
        mx.broadcast_to(base[:1, :, 0], (5, 128)),     # stride-0 rows
        base[..., 1],                                  # last axis strided
    ]
    for x in views:
        got = ext.quantized_matmul(x, w, scales, biases, transpose=True, group_size=32, bits=4)
        assert_near(got, f64(mx.quantized_matmul(x, w, scales, biases, group_size=32, bits=4)),
                    mx.float32)
    # A weight quantized from a transposed view, and non-contiguous scales.
    wt, st, bt = mx.quantize(mx.array(rng.standard_normal((128, 64)).astype(np.float32)).T,
                             group_size=32, bits=8)
    st2 = mx.array(np.array(st).T.copy()).T  # same values, transposed strides
    x = views[1]
    got = ext.quantized_matmul(x, wt, st2, bt, transpose=True, group_size=32, bits=8)
    assert_near(got, f64(mx.quantized_matmul(x, wt, st, bt, group_size=32, bits=8)), mx.float32)


def test_qmm_inside_compile_and_shapeless_compile(ext):
    rng = np.random.default_rng(3)
    w, scales, biases = quantized(rng, (96, 64), mx.float32, 32, 4)

    def f(x):
        return ext.quantized_matmul(x, w, scales, biases, transpose=True, group_size=32,
                                    bits=4) * 2.0

    for shapeless in (False, True):
        compiled = mx.compile(f, shapeless=shapeless)
        for rows in (1, 3, 8):
            x = mx.array(rng.standard_normal((rows, 64)).astype(np.float32))
            want = mx.quantized_matmul(x, w, scales, biases, group_size=32, bits=4) * 2.0
            assert_near(compiled(x), f64(want), mx.float32)


def test_qmm_from_several_threads(ext):
    rng = np.random.default_rng(4)
    w, scales, biases = quantized(rng, (512, 256), mx.float32, 64, 4)
    inputs = [mx.array(rng.standard_normal((2, 256)).astype(np.float32)) for _ in range(4)]
    wants = [f64(mx.quantized_matmul(x, w, scales, biases, group_size=64, bits=4))
             for x in inputs]
    errors: list[str] = []

    def work(i: int) -> None:
        # Half the threads on their own CPU stream: kernels then run at the
        # same time and share the thread pool.
        stream = mx.new_stream(mx.cpu) if i % 2 else mx.default_stream(mx.cpu)
        try:
            with mx.stream(stream):
                for _ in range(20):
                    got = ext.quantized_matmul(inputs[i], w, scales, biases, transpose=True,
                                               group_size=64, bits=4)
                    assert_near(got, wants[i], mx.float32)
        except Exception as exc:  # reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_qmm_covers():
    f32 = mx.float32
    good = dict(x=((1, 64), f32), w=((8, 8), mx.uint32), scales=((8, 2), f32),
                biases=((8, 2), f32), transpose=True, group_size=32, bits=4, mode="affine")
    assert kernels.covers_quantized_matmul(**good)
    for change in (dict(mode="mxfp4"), dict(biases=None), dict(x=((64,), f32)),
                   dict(w=((2, 8, 8), mx.uint32)), dict(x=((1, 64), mx.float64)),
                   dict(scales=((8, 3), f32)), dict(x=((1, 32), f32)), dict(group_size=16),
                   dict(x=((0, 64), f32))):
        assert not kernels.covers_quantized_matmul(**{**good, **change}), change


# -- RMS norm, RoPE, attention ---------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(96,), (3, 5, 64), (1, 1, 576), (4, 7)])
def test_rms_norm_matches_mlx(ext, isa, dtype, shape):
    rng = np.random.default_rng(5)
    x = mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)
    w = mx.array(rng.standard_normal(shape[-1]).astype(np.float32)).astype(dtype)
    got = ext.rms_norm(x, w, eps=1e-5)
    ref = mx.fast.rms_norm(x, w, 1e-5)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert_near(got, f64(ref), dtype)
    strided = x[..., ::-1] if len(shape) > 1 else x
    assert_near(ext.rms_norm(strided, w, eps=1e-5), f64(mx.fast.rms_norm(strided, w, 1e-5)),
                dtype)


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_matches_mlx(ext, isa, traditional, dtype):
    rng = np.random.default_rng(6)
    x = mx.array(rng.standard_normal((2, 3, 5, 40)).astype(np.float32)).astype(dtype)
    freqs = mx.array(rng.uniform(1, 100, 16).astype(np.float32))
    for dims in (40, 32):
        for offset in (mx.array([0], mx.int32), mx.array([1000], mx.int32),
                       mx.array([3, 77], mx.int32)):
            for f in (None, freqs if dims == 32 else None):
                ref = mx.fast.rope(x, dims, traditional=traditional,
                                   base=None if f is not None else 10000.0, scale=0.5,
                                   offset=offset if offset.size > 1 else offset.reshape(()),
                                   freqs=f)
                got = ext.rope(x, offset, dims=dims, traditional=traditional, base=10000.0,
                               scale=0.5, freqs=f)
                assert got.dtype == ref.dtype
                assert_near(got, f64(ref), dtype)
    # [B, T, D] (no head axis) and a transposed view.
    x3 = mx.array(rng.standard_normal((2, 6, 16)).astype(np.float32))
    view = mx.array(rng.standard_normal((2, 16, 6)).astype(np.float32)).swapaxes(1, 2)
    for v in (x3, view):
        got = ext.rope(v, mx.array([4], mx.int32), dims=16, traditional=traditional,
                       base=500.0, scale=1.0)
        ref = mx.fast.rope(v, 16, traditional=traditional, base=500.0, scale=1.0, offset=4)
        assert_near(got, f64(ref), mx.float32)


def reference_attention(q, k, v, start, key_mask, scale):
    """float64 attention: query t sees key j when j <= start + t and key_mask."""
    q, k, v = f64(q), f64(k), f64(v)
    B, H, T, D = q.shape
    group = H // k.shape[1]
    out = np.zeros_like(q)
    for b in range(B):
        for h in range(H):
            kh, vh = k[b, h // group], v[b, h // group]
            for t in range(T):
                seen = np.arange(k.shape[2]) <= start + t
                if key_mask is not None:
                    seen &= np.array(key_mask)[b]
                if not seen.any():
                    continue
                s = kh[seen] @ q[b, h, t] * scale
                p = np.exp(s - s.max())
                out[b, h, t] = (p / p.sum()) @ vh[seen]
    return out


@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (9, 3), (3, 1)])
def test_cache_attention_matches_reference(ext, isa, heads):
    rng = np.random.default_rng(7)
    H, H_kv = heads
    B, S, D = 2, 19, 32
    k = mx.array(rng.standard_normal((B, H_kv, S, D)).astype(np.float32))
    v = mx.array(rng.standard_normal((B, H_kv, S, D)).astype(np.float32))
    for T in (1, 4):
        q = mx.array(rng.standard_normal((B, H, T, D)).astype(np.float32))
        for start in (0, 7, S - T):
            masks = [None, mx.array(rng.random((B, S)) > 0.4),
                     mx.array(np.arange(S)[None, :].repeat(B, 0) >= 12)]  # row 0..11 unseen
            for key_mask in masks:
                got = ext.cache_attention(q, [k, v], mx.array([start], mx.int32), key_mask,
                                          scale=0.3)
                want = reference_attention(q, k, v, start, key_mask, 0.3)
                np.testing.assert_allclose(f64(got), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("S, T", [(40, 7), (150, 37)])
def test_cache_attention_prefill_equals_one_query_at_a_time(ext, isa, D, S, T):
    # A prefill's consecutive positions of a head are scored and summed
    # together, a block of keys and value rows at a time (each read once
    # for all of them; 150 keys are three blocks, 37 queries a block and a
    # half of them); every query's output must be the bits it gets alone,
    # with or without a key mask.
    rng = np.random.default_rng(17)
    B, H, H_kv = 2, 9, 3
    k = mx.array(rng.standard_normal((B, H_kv, S, D)).astype(np.float32))
    v = mx.array(rng.standard_normal((B, H_kv, S, D)).astype(np.float32))
    q = mx.array(rng.standard_normal((B, H, T, D)).astype(np.float32))
    for start in (0, 5, S - T):
        for key_mask in (None, mx.array(rng.random((B, S)) > 0.3)):
            got = np.array(ext.cache_attention(q, [k, v], mx.array([start], mx.int32), key_mask,
                                               scale=0.125))
            np.testing.assert_allclose(got, reference_attention(q, k, v, start, key_mask, 0.125),
                                       rtol=1e-4, atol=1e-5)
            for t in range(T):
                alone = ext.cache_attention(q[:, :, t:t + 1], [k, v],
                                            mx.array([start + t], mx.int32), key_mask,
                                            scale=0.125)
                np.testing.assert_array_equal(got[:, :, t:t + 1].view(np.uint32),
                                              np.array(alone).view(np.uint32))


@pytest.mark.parametrize("type_name", ["Q5_0", "Q4_K", "Q8_0"])
def test_ggml_prefill_gemm_same_bits_for_short_and_long_prompts(ext, isa, type_name):
    # Exact numerics from 8 rows on: up to 256 rows the dequantized weight
    # rows are the GEMM's A, beyond that x is; each output sums the same
    # products in the same order either way, so a short prompt's rows are
    # the bits the same rows get inside a long one.
    from ggml_blocks import random_blocks, reference
    from mlxprog.ggml import types as ggml_types

    rng = np.random.default_rng(18)
    t = ggml_types.BY_NAME[type_name]
    w = random_blocks(rng, type_name, 150, 512)
    x = rng.standard_normal((300, 512)).astype(np.float32)
    long = np.array(ext.ggml_matmul(mx.array(x), mx.array(w), type=t.id, int8=False))
    dense = reference(type_name, w).astype(np.float64)
    want = x.astype(np.float64) @ dense.T
    bound = 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(dense).T) + 1e-6
    assert np.all(np.abs(long - want) <= bound)
    for rows in (8, 21, 256):
        short = np.array(ext.ggml_matmul(mx.array(x[:rows]), mx.array(w), type=t.id, int8=False))
        np.testing.assert_array_equal(short.view(np.uint32), long[:rows].view(np.uint32))


# -- dispatch from programs ------------------------------------------------------------


def qmm_program(x_shape, w, scales, biases, **attrs):
    b = mp.ProgramBuilder("qmm")
    x = b.input("x", x_shape, "float32")
    parts = [b.capture(n, a.shape, mp.arrays.name_of(a.dtype))
             for n, a in (("w", w), ("s", scales), ("b", biases))]
    y = b.quantized_matmul(x, *parts, **attrs)
    return b.build([b.fast_rms_norm(y, b.capture("g", (y.shape[-1],), "float32"), eps=1e-5)])


def test_programs_use_native_kernels_and_match_mlx_ops(ext):
    rng = np.random.default_rng(8)
    w, scales, biases = quantized(rng, (64, 128), mx.float32, 32, 4)
    captures = {"w": w, "s": scales, "b": biases, "g": mx.ones((64,))}
    prog = qmm_program((3, 128), w, scales, biases, group_size=32, bits=4)
    x = mx.array(rng.standard_normal((3, 128)).astype(np.float32))
    results = {}
    for flag in (True, False):
        for eager in (False, True):
            exe = mp.compile(prog, captures=captures, native=flag, eager=eager)
            results[flag, eager] = exe(x)[0]
            assert exe.stats.native is flag
            expected = {"quantized_matmul": 1, "fast_rms_norm": 1} if flag else {}
            assert exe.stats.native_ops == expected
            assert exe.stats.as_dict()["native_ops"] == expected
    for key, value in results.items():
        assert_near(value, f64(results[False, False]), mx.float32)


def test_native_default_follows_environment(ext, monkeypatch):
    rng = np.random.default_rng(9)
    w, scales, biases = quantized(rng, (64, 128), mx.float32, 32, 4)
    prog = qmm_program((1, 128), w, scales, biases, group_size=32, bits=4)
    captures = {"w": w, "s": scales, "b": biases, "g": mx.ones((64,))}
    x = mx.ones((1, 128))
    monkeypatch.setenv("MLXPROG_NATIVE", "0")
    off = mp.compile(prog, captures=captures)
    off(x)
    assert not off.stats.native and off.stats.native_ops == {}
    monkeypatch.setenv("MLXPROG_NATIVE", "1")
    on = mp.compile(prog, captures=captures)
    on(x)
    assert on.stats.native_ops == {"quantized_matmul": 1, "fast_rms_norm": 1}


def test_uncovered_cases_run_mlx_ops(ext):
    rng = np.random.default_rng(10)
    wf = mx.array(rng.standard_normal((2, 32, 64)).astype(np.float32))  # a batch of weights
    w, scales, biases = mx.quantize(wf, group_size=32, bits=4)
    b = mp.ProgramBuilder("batched")
    x = b.input("x", (2, 1, 64), "float32")
    caps = [b.capture(n, a.shape, "uint32" if n == "w" else "float32")
            for n, a in (("w", w), ("s", scales), ("b", biases))]
    prog = b.build([b.quantized_matmul(x, *caps, group_size=32, bits=4)])
    exe = mp.compile(prog, captures={"w": w, "s": scales, "b": biases}, native=True)
    xv = mx.array(rng.standard_normal((2, 1, 64)).astype(np.float32))
    got = exe(xv)[0]
    assert exe.stats.native_ops == {}
    np.testing.assert_allclose(np.array(got), np.array(
        mx.quantized_matmul(xv, w, scales, biases, group_size=32, bits=4)), rtol=1e-6)


def test_shapes_mlx_rejects_keep_their_validation_error(ext):
    w, scales, biases = mx.quantize(mx.ones((64, 128)), group_size=32, bits=4)
    b = mp.ProgramBuilder("bad")
    x = b.input("x", (1, 96), "float32")
    caps = [b.capture(n, a.shape, mp.arrays.name_of(a.dtype))
            for n, a in (("w", w), ("s", scales), ("b", biases))]
    with pytest.raises(mp.ValidationError, match=r"instruction 0 \(quantized_matmul\)"):
        b.quantized_matmul(x, *caps, group_size=32, bits=4)


def test_kv_cache_program_native_matches_mlx(ext):
    rng = np.random.default_rng(11)
    B, H, H_kv, T, S, D = 1, 6, 2, 2, 16, 32
    b = mp.ProgramBuilder("attend")
    q = b.input("q", (B, H, T, D), "float32")
    nk = b.input("k", (B, H_kv, T, D), "float32")
    nv = b.input("v", (B, H_kv, T, D), "float32")
    kc = b.input("kc", (B, H_kv, S, D), "float32")
    vc = b.input("vc", (B, H_kv, S, D), "float32")
    off = b.input("offset", (), "int32")
    mask = b.input("mask", (B, S), "bool")
    qr = b.fast_rope(q, off, dims=D, base=10000.0)
    outs = b.kv_cache_sdpa_update(qr, nk, nv, kc, vc, off, mask, layout="BHTD")
    prog = b.build(list(outs))
    args = [mx.array(rng.standard_normal(s).astype(np.float32)) for s in
            ((B, H, T, D), (B, H_kv, T, D), (B, H_kv, T, D), (B, H_kv, S, D), (B, H_kv, S, D))]
    args += [mx.array(5, mx.int32), mx.array(rng.random((B, S)) > 0.2)]
    native_out = mp.compile(prog, native=True)
    mlx_out = mp.compile(prog, native=False)
    for got, want in zip(native_out(*args), mlx_out(*args)):
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)
    assert native_out.stats.native_ops == {"fast_rope": 1, "kv_cache_sdpa_update": 1}


# -- building and the fallback ---------------------------------------------------------------


def test_build_key_tracks_what_the_binary_depends_on():
    tools = build.find_toolchain()
    key = build.build_key(tools)
    assert key == build.build_key(tools)
    for change in (dict(mlx_version="0.0.1"), dict(nanobind_version="9.9"),
                   dict(compiler_version="other 1.0")):
        assert build.build_key(build.Toolchain(**{**tools.__dict__, **change})) != key


def test_cached_build_is_reused(ext, monkeypatch):
    path = build.ensure_built()
    monkeypatch.setattr(build, "_run_build", lambda *a: pytest.fail("rebuilt"))
    assert build.ensure_built() == path


def test_failed_build_is_remembered(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXPROG_CACHE_DIR", str(tmp_path))

    def fail(tools, work, log):
        log.write_text("compiler exploded\n")
        raise build.BuildError(f"the native build failed (exit 1); its log is {log}")

    monkeypatch.setattr(build, "_run_build", fail)
    with pytest.raises(build.BuildError, match="failed.log"):
        build.ensure_built()
    (failed,) = tmp_path.glob("native/*/failed.log")
    assert failed.read_text() == "compiler exploded\n"
    with pytest.raises(build.BuildError, match="earlier native build"):
        build.ensure_built()  # not retried


def test_toolchain_problems_are_named(monkeypatch, tmp_path):
    monkeypatch.setattr(build, "_find_cmake", lambda: None)
    with pytest.raises(build.BuildError, match="cmake was not found"):
        build.find_toolchain()
    monkeypatch.undo()
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(build.BuildError, match="does not run"):
        build.find_toolchain()


def test_missing_toolchain_warns_once_and_runs_mlx_ops(monkeypatch):
    monkeypatch.setattr(native, "_status", None)
    monkeypatch.setattr(native, "_module", None)

    def missing(progress=None):
        raise build.BuildError("no C++ compiler was found")

    monkeypatch.setattr(build, "ensure_built", missing)
    w, scales, biases = mx.quantize(mx.ones((64, 128)), group_size=32, bits=4)
    prog = qmm_program((1, 128), w, scales, biases, group_size=32, bits=4)
    with pytest.warns(RuntimeWarning, match="no C.. compiler"):  # at compile, not in a trace
        exe = mp.compile(prog, captures={"w": w, "s": scales, "b": biases,
                                         "g": mx.ones((64,))}, native=True)
    out = exe(mx.ones((1, 128)))[0]
    assert exe.stats.native_ops == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once only
        exe2 = mp.compile(prog, captures={"w": w, "s": scales, "b": biases,
                                          "g": mx.ones((64,))}, native=True)
        out2 = exe2(mx.ones((1, 128)))[0]
    np.testing.assert_allclose(np.array(out), np.array(out2))
    assert not native.status().available and "compiler" in native.status().reason


# -- the real model --------------------------------------------------------------------


def test_real_model_same_greedy_tokens_native_and_mlx_ops(ext):
    from llm_fixtures import CHAT_PROMPT, smollm_path

    from mlxprog.llm import LLM, load_checkpoint

    checkpoint = load_checkpoint(smollm_path())
    outputs = {}
    for flag in (True, False):
        llm = LLM(checkpoint, max_length=64, native=flag)
        outputs[flag] = llm.generate(CHAT_PROMPT, max_tokens=24, chat=False)
        decode = llm.executable("decode")
        assert bool(decode.stats.native_ops) is flag
    assert outputs[True].text.startswith("The capital of France is Paris."), outputs[True].text
    assert outputs[True].tokens == outputs[False].tokens


def test_inspect_reports_native_coverage(ext, tmp_path, capsys):
    from mlxprog.cli import main

    rng = np.random.default_rng(12)
    w, scales, biases = quantized(rng, (64, 128), mx.float32, 32, 4)
    path = tmp_path / "qmm.json"
    qmm_program((2, 128), w, scales, biases, group_size=32, bits=4).save(path)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"native CPU kernels: {native.status()}" in out
    assert "quantized_matmul: 1 of 1 instruction(s)" in out
    assert "fast_rms_norm: 1 of 1 instruction(s)" in out
    # mxfp4 has no native kernel: counted, not covered.
    b = mp.ProgramBuilder("fp4")
    x = b.input("x", (2, 128), "float32")
    wq, sq = mx.quantize(mx.ones((64, 128)), mode="mxfp4")
    prog = b.build([b.quantized_matmul(x, b.capture("w", wq.shape, "uint32"),
                                       b.capture("s", sq.shape, "uint8"), mode="mxfp4")])
    prog.save(path)
    assert main(["inspect", str(path)]) == 0
    assert "quantized_matmul: 0 of 1 instruction(s)" in capsys.readouterr().out


def test_norm_rope_attention_in_shapeless_compile(ext):
    rng = np.random.default_rng(13)
    w = mx.array(rng.standard_normal(32).astype(np.float32))
    k = mx.array(rng.standard_normal((1, 2, 24, 32)).astype(np.float32))
    v = mx.array(rng.standard_normal((1, 2, 24, 32)).astype(np.float32))
    start = mx.array([3], mx.int32)

    def f(q):
        q = ext.rope(ext.rms_norm(q, w, eps=1e-5), start, dims=32, traditional=False,
                     base=10000.0, scale=1.0)
        return ext.cache_attention(q, [k, v], start, None, scale=0.2)

    def reference(q):
        q = mx.fast.rope(mx.fast.rms_norm(q, w, 1e-5), 32, traditional=False, base=10000.0,
                         scale=1.0, offset=3)
        return reference_attention(q, k, v, 3, None, 0.2)

    compiled = mx.compile(f, shapeless=True)
    for T in (1, 2, 5):
        q = mx.array(rng.standard_normal((1, 4, T, 32)).astype(np.float32))
        np.testing.assert_allclose(f64(compiled(q)), reference(q), rtol=1e-4, atol=1e-5)


def test_no_native_kernels_off_the_cpu(ext, monkeypatch):
    w, scales, biases = mx.quantize(mx.ones((64, 128)), group_size=32, bits=4)
    x = mx.ones((1, 128))
    call = dict(transpose=True, group_size=32, bits=4, mode="affine")
    on = native.Setting(True)
    assert kernels.quantized_matmul(on, x, w, scales, biases, **call) is not None
    assert on.counts == {"quantized_matmul": 1}
    monkeypatch.setattr(native.mx, "default_device", lambda: mx.Device(mx.gpu))
    assert kernels.quantized_matmul(on, x, w, scales, biases, **call) is None
    assert kernels.quantized_matmul(native.Setting(False), x, w, scales, biases, **call) is None


def test_cache_attention_peaked_and_long(ext, isa):
    # Large scores (a peaked softmax) and a long cache exercise the vector exp.
    rng = np.random.default_rng(14)
    q = mx.array(rng.standard_normal((1, 4, 1, 16)).astype(np.float32) * 6)
    k = mx.array(rng.standard_normal((1, 2, 300, 16)).astype(np.float32) * 6)
    v = mx.array(rng.standard_normal((1, 2, 300, 16)).astype(np.float32))
    got = ext.cache_attention(q, [k, v], mx.array([299], mx.int32), None, scale=1.0)
    np.testing.assert_allclose(f64(got), reference_attention(q, k, v, 299, None, 1.0),
                               rtol=1e-4, atol=1e-5)


# -- the kernel tables without MLX (host, and arm64 under qemu) ---------------------------


X86_TABLES = {  # the extra x86-64 tables: file, flags, kernels.cpp's definition
    "avx2+avxvnni": ("kernels_avxvnni.cpp", ["-mavxvnni"], "MLXPROG_HAVE_AVXVNNI"),
    "avx2+avx512vnni": ("kernels_avx512vnni.cpp",
                        ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni",
                         "-mprefer-vector-width=256"], "MLXPROG_HAVE_AVX512VNNI"),
}


def run_selftest(compiler: str, avx2_flags: list[str], link_flags: list[str],
                 runner: list[str], isa_name: str | None,
                 extra_tables: dict[str, tuple[str, list[str], str]] | None = None) -> str:
    """Build tests/native_selftest.cpp with the kernel tables (each with its
    own flags, as CMakeLists.txt does; ``extra_tables`` as X86_TABLES; once
    per session, see kernel_tables) and run it; its output."""
    import os
    import subprocess
    from pathlib import Path

    import kernel_tables

    binary = kernel_tables.selftest(compiler, Path(__file__).parent / "native_selftest.cpp",
                                    avx2_flags, link_flags, extra_tables)
    env = {k: v for k, v in os.environ.items() if k != "MLXPROG_NATIVE_ISA"}
    if isa_name:
        env["MLXPROG_NATIVE_ISA"] = isa_name
    done = subprocess.run([*runner, str(binary)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("isa_name", ["portable", "avx2", None])
def test_kernel_tables_on_the_host(isa_name):
    """Every table this CPU runs (None: the best), built as the extension is."""
    import platform
    import shutil

    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    x86 = platform.machine() in ("x86_64", "AMD64")
    if isa_name == "avx2" and "avx2" not in native.module().isas():
        pytest.skip("no AVX2 here")
    import kernel_tables

    out = run_selftest(compiler, kernel_tables.AVX2_FLAGS if x86 else [], [], [], isa_name,
                       X86_TABLES if x86 else None)
    assert out.startswith(f"table: {isa_name or native.status().isa}")


def test_portable_kernels_on_arm64_under_qemu():
    compiler, qemu = cross_tools()  # skips locally, fails under CI, without them
    out = run_selftest(compiler, [], ["-static"], [qemu], None)
    assert out.startswith("table: portable")


def test_dot_product_kernels_on_arm64_under_qemu():
    """The arm64 table with sdot (armv8.2-a+dotprod), which qemu emulates."""
    compiler, qemu = cross_tools()  # skips locally, fails under CI, without them
    tables = {"neon+dotprod": ("kernels_dotprod.cpp", ["-march=armv8.2-a+dotprod"],
                               "MLXPROG_HAVE_DOTPROD")}
    out = run_selftest(compiler, [], ["-static"], [qemu], None, tables)
    assert out.startswith("table: neon+dotprod")


def test_cache_attention_non_finite_scores_give_nan_like_mlx(ext, isa):
    q = mx.concatenate([mx.full((1, 1, 1, 8), float("nan")), mx.full((1, 1, 1, 8), float("inf"))],
                       axis=1)
    k = mx.ones((1, 1, 4, 8))
    v = mx.ones((1, 1, 4, 8))
    got = np.array(ext.cache_attention(q, [k, v], mx.array([3], mx.int32), None, scale=1.0))
    ref = np.array(mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0))
    assert np.isnan(ref).all() and np.isnan(got).all()


def test_cache_attention_a_nan_key_among_many_gives_nan_where_seen(ext, isa):
    # Scores are masked and searched for their maximum eight at a time:
    # a NaN key past the first eight turns exactly the queries that see it
    # (unmasked) into NaN, and leaves the others as the reference gives them.
    rng = np.random.default_rng(9)
    B, H, S, T, D = 1, 2, 21, 6, 16
    k = rng.standard_normal((B, 1, S, D)).astype(np.float32)
    k[0, 0, 13] = np.nan
    v = mx.array(rng.standard_normal((B, 1, S, D)).astype(np.float32))
    q = mx.array(rng.standard_normal((B, H, T, D)).astype(np.float32))
    for key_mask, sees in ((None, True), (mx.array(np.arange(S)[None] != 13), False)):
        got = np.array(ext.cache_attention(q, [mx.array(k), v], mx.array([10], mx.int32),
                                           key_mask, scale=0.5))
        for t in range(T):
            if sees and 10 + t >= 13:
                assert np.isnan(got[:, :, t]).all()
            else:
                k_seen = np.where(np.isnan(k), 0, k)
                want = reference_attention(q[:, :, t:t + 1], mx.array(k_seen), v, 10 + t,
                                           key_mask, 0.5)
                np.testing.assert_allclose(got[:, :, t:t + 1], want, rtol=1e-4, atol=1e-5)


def test_set_codebook_names_what_it_refuses(ext):
    """The binding's refusal of an unknown codebook or a wrong size is a
    ValueError naming both."""
    with pytest.raises(ValueError, match="no codebook 'iq3s_grid' of 4 bytes"):
        ext.set_codebook("iq3s_grid", mx.zeros((4,), dtype=mx.uint8))
    with pytest.raises(ValueError, match="no codebook 'grid' of 4 bytes"):
        ext.set_codebook("grid", mx.zeros((4,), dtype=mx.uint8))


def test_thread_and_isa_environment_variables(ext):
    import os
    import subprocess
    import sys

    script = (
        "import mlx.core as mx\n"
        "from mlxprog import native\n"
        "ext = native.module()\n"
        "w, s, b = mx.quantize(mx.random.normal((256, 128)), group_size=32, bits=4)\n"
        "x = mx.random.normal((3, 128))\n"
        "got = ext.quantized_matmul(x, w, s, b, transpose=True, group_size=32, bits=4)\n"
        "want = mx.quantized_matmul(x, w, s, b, group_size=32, bits=4)\n"
        "assert mx.allclose(got, want, rtol=1e-4, atol=1e-4).item()\n"
        "print(ext.threads(), ext.isa())\n"
    )
    env = {**os.environ, "MLXPROG_NATIVE_THREADS": "1", "MLXPROG_NATIVE_ISA": "portable"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "portable"]


def test_rope_ops_are_counted_under_their_own_names(ext):
    b = mp.ProgramBuilder("ropes")
    x = b.input("x", (1, 3, 2, 16), "float32")  # [B, T, H, D] for the positions ops
    positions = b.input("positions", (1, 3), "int32")
    freqs = b.constant([float(i + 1) for i in range(8)], "float32")
    outs = [b.fast_rope_positions(x, positions, dims=16),
            b.fast_rope_with_freqs_positions(x, positions, freqs, dims=16),
            b.fast_rope(x, dims=16), b.fast_rope_with_freqs(x, freqs, dims=16)]
    exe = mp.compile(b.build(outs), native=True)
    exe(mx.ones((1, 3, 2, 16)), mx.array([[0, 1, 5]], mx.int32))
    assert exe.stats.native_ops == {"fast_rope_positions": 1, "fast_rope_with_freqs_positions": 1,
                                    "fast_rope": 1, "fast_rope_with_freqs": 1}
