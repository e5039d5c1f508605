"""The int8 numerics of ``quantized_matmul`` (mlxprog/native, docs/native.md):
every kernel table against a float64 reference of the numerics' definition,
``dequantize(w) @ xhat`` with ``xhat`` the per-group int8 quantization of x,
and against the exact product within the bound the activation rounding
allows; over the shapes, dtypes and layouts the exact kernel is tested on.
Then the op's attribute: validation, dispatch, and the fallback to exact
numerics (counted in ``exe.stats``) where no kernel honours it."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from mlxprog import native
from mlxprog.native import kernels

# Relative to the largest reference value: float32 combination of the groups
# (the integer sums are exact), and for half types the rounding of the output.
RTOL = {mx.float32: 2e-5, mx.float16: 4e-3, mx.bfloat16: 3e-2}
DTYPES = [mx.float32, mx.float16, mx.bfloat16]


def f64(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32)).astype(np.float64)


def quantize_activations(x: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """xhat (float64) and the per-group scales d, computed in float32 exactly
    as the numerics define them: d = max|x| / 127, q = rint(x * (127 / max|x|))."""
    x32 = x.astype(np.float32)
    groups = x32.reshape(*x32.shape[:-1], -1, group_size)
    amax = np.abs(groups).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(groups * inv)
    d = (amax / np.float32(127)).astype(np.float32)
    xhat = (q * d).astype(np.float64).reshape(x32.shape)
    return xhat, d[..., 0].astype(np.float64)


def check_int8(got: mx.array, x: mx.array, w, scales, biases, group_size: int, bits: int,
               out_dtype) -> None:
    """``got`` is dequantize(w) @ xhat within float32 (or output) rounding,
    and the exact product within the activation-rounding bound."""
    # float32 scales and biases: MLX's dequantize would round to half types.
    wd = f64(mx.dequantize(w, scales.astype(mx.float32), biases.astype(mx.float32),
                           group_size=group_size, bits=bits))
    xs = np.array(x.astype(mx.float32))
    xhat, d = quantize_activations(xs, group_size)
    want = xhat @ wd.T
    scale = max(np.abs(want).max(), 1e-6)
    err = np.abs(f64(got) - want).max() / scale
    assert err <= RTOL[out_dtype], f"error {err:.2e} against dequantize(w) @ xhat"
    # |x - xhat| <= d / 2 elementwise, so |W x - W xhat| <= sum_g d_g / 2 * sum_{k in g} |w|.
    exact = xs.astype(np.float64) @ wd.T
    abs_groups = np.abs(wd).reshape(wd.shape[0], -1, group_size).sum(-1)  # [N, groups]
    bound = (d / 2) @ abs_groups.T
    slack = RTOL[out_dtype] * np.abs(exact).max() + 1e-6
    assert (np.abs(f64(got) - exact) <= bound + slack).all()


def quantized(rng, shape, dtype, group_size, bits):
    w = mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)
    return mx.quantize(w, group_size=group_size, bits=bits)


def int8_qmm(ext, x, w, scales, biases, group_size, bits):
    return ext.quantized_matmul(x, w, scales, biases, transpose=True, group_size=group_size,
                                bits=bits, int8=True)


# -- the kernels -----------------------------------------------------------------------


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 13])
def test_int8_matches_reference(ext, isa, bits, group_size, rows):
    rng = np.random.default_rng(bits * 1000 + group_size + rows)
    K = 3 * group_size
    for n in (1, 4, 37):  # weight-row tiles of four, and the tails
        w, scales, biases = quantized(rng, (n, K), mx.float32, group_size, bits)
        x = mx.array(rng.standard_normal((rows, K)).astype(np.float32))
        got = int8_qmm(ext, x, w, scales, biases, group_size, bits)
        assert got.shape == (rows, n) and got.dtype == mx.float32
        check_int8(got, x, w, scales, biases, group_size, bits, mx.float32)


def test_int8_is_not_the_exact_product(ext, isa):
    """A kernel that ignored the numerics would pass the bound check; the
    activation rounding must be visible."""
    rng = np.random.default_rng(5)
    w, scales, biases = quantized(rng, (64, 256), mx.float32, 32, 4)
    x = mx.array(rng.standard_normal((1, 256)).astype(np.float32))
    got = f64(int8_qmm(ext, x, w, scales, biases, 32, 4))
    exact = f64(mx.quantized_matmul(x, w, scales, biases, group_size=32, bits=4))
    assert np.abs(got - exact).max() > 1e-4 * np.abs(exact).max()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 128])
def test_int8_tables_agree(ext, bits, group_size):
    """Every table this CPU runs (VNNI, AVX2, dot-product, portable) computes
    the same exact integer sums: results differ by float32 rounding of the
    group combination only."""
    rng = np.random.default_rng(6)
    w, scales, biases = quantized(rng, (33, 2 * group_size), mx.float32, group_size, bits)
    results = {}
    for name in ext.isas():
        ext.set_isa(name)
        for rows in (1, 2, 5, 9):
            x = mx.array(np.random.default_rng(rows).standard_normal(
                (rows, 2 * group_size)).astype(np.float32))
            results[name, rows] = f64(int8_qmm(ext, x, w, scales, biases, group_size, bits))
    ext.set_isa("best")
    for (name, rows), got in results.items():
        base = results["portable", rows]
        np.testing.assert_allclose(got, base, rtol=1e-5, atol=1e-5 * np.abs(base).max(),
                                   err_msg=f"{name}, {rows} rows")


@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("scale_dtype", DTYPES)
def test_int8_dtypes_promote_like_mlx(ext, isa, x_dtype, scale_dtype):
    rng = np.random.default_rng(7)
    w, scales, biases = quantized(rng, (24, 128), scale_dtype, 32, 4)
    x = mx.array(rng.standard_normal((2, 128)).astype(np.float32)).astype(x_dtype)
    got = int8_qmm(ext, x, w, scales, biases, 32, 4)
    out_dtype = mx.quantized_matmul(x, w, scales, biases, group_size=32, bits=4).dtype
    assert got.dtype == out_dtype
    check_int8(got, x, w, scales, biases, 32, 4, out_dtype)


@pytest.mark.parametrize("shape", [(1, 1, 96), (2, 3, 96), (2, 1, 4, 96), (7, 96), (1, 96)])
def test_int8_batch_dims(ext, isa, shape):
    rng = np.random.default_rng(8)
    w, scales, biases = quantized(rng, (5, 96), mx.float32, 32, 4)
    x = mx.array(rng.standard_normal(shape).astype(np.float32))
    got = int8_qmm(ext, x, w, scales, biases, 32, 4)
    assert got.shape == (*shape[:-1], 5)
    check_int8(got.reshape(-1, 5), x.reshape(-1, 96), w, scales, biases, 32, 4, mx.float32)


def test_int8_non_contiguous_inputs(ext, isa):
    rng = np.random.default_rng(9)
    w, scales, biases = quantized(rng, (64, 128), mx.float32, 32, 4)
    base = mx.array(rng.standard_normal((6, 128, 4)).astype(np.float32))
    for x in (base.transpose(0, 2, 1)[:, :3], base[::2, :, 0], mx.broadcast_to(base[:1, :, 0],
                                                                              (5, 128))):
        got = int8_qmm(ext, x, w, scales, biases, 32, 4)
        flat = x.reshape(-1, 128)
        check_int8(got.reshape(-1, 64), flat, w, scales, biases, 32, 4, mx.float32)
    wt, st, bt = mx.quantize(mx.array(rng.standard_normal((128, 64)).astype(np.float32)).T,
                             group_size=32, bits=8)
    st2 = mx.array(np.array(st).T.copy()).T  # same values, transposed strides
    x = base[:2, :, 1]
    check_int8(int8_qmm(ext, x, wt, st2, bt, 32, 8), x, wt, st, bt, 32, 8, mx.float32)


def test_int8_special_values(ext, isa):
    w, scales, biases = quantized(np.random.default_rng(10), (8, 64), mx.float32, 32, 4)
    zeros = int8_qmm(ext, mx.zeros((1, 64)), w, scales, biases, 32, 4)
    assert (np.array(zeros) == 0).all()
    for bad in (float("inf"), float("nan")):
        x = mx.concatenate([mx.ones((1, 64)), mx.ones((1, 64))])
        x = mx.where(mx.arange(128).reshape(2, 64) == 70, bad, x)  # row 1, second group
        got = np.array(int8_qmm(ext, x, w, scales, biases, 32, 4))
        assert np.isfinite(got[0]).all() and np.isnan(got[1]).all()


def test_int8_inside_compile(ext):
    rng = np.random.default_rng(11)
    w, scales, biases = quantized(rng, (96, 64), mx.float32, 32, 4)

    def f(x):
        return int8_qmm(ext, x, w, scales, biases, 32, 4) * 2.0

    for shapeless in (False, True):
        compiled = mx.compile(f, shapeless=shapeless)
        for rows in (1, 3, 9):
            x = mx.array(rng.standard_normal((rows, 64)).astype(np.float32))
            np.testing.assert_allclose(f64(compiled(x)), f64(f(x)), rtol=1e-6, atol=1e-6)


def test_int8_kernel_rejects_what_it_does_not_cover(ext):
    w, scales, biases = mx.quantize(mx.ones((8, 64)), group_size=32, bits=2)
    with pytest.raises(ValueError, match="4 or 8 bits"):
        int8_qmm(ext, mx.ones((1, 64)), w, scales, biases, 32, 2)


# -- the op's attribute -------------------------------------------------------------------


def qmm_program(x_shape, w, scales, biases, **attrs):
    b = mp.ProgramBuilder("qmm")
    x = b.input("x", x_shape, "float32")
    parts = [b.capture(n, a.shape, mp.arrays.name_of(a.dtype))
             for n, a in (("w", w), ("s", scales), ("b", biases))]
    return b.build([b.quantized_matmul(x, *parts, **attrs)])


@pytest.mark.parametrize("eager", [False, True])
def test_program_int8_runs_the_kernel(ext, eager):
    rng = np.random.default_rng(12)
    w, scales, biases = quantized(rng, (48, 128), mx.float32, 64, 8)
    prog = qmm_program((2, 128), w, scales, biases, group_size=64, bits=8, numerics="int8")
    exe = mp.compile(prog, captures={"w": w, "s": scales, "b": biases}, eager=eager,
                     native=True)
    x = mx.array(rng.standard_normal((2, 128)).astype(np.float32))
    (got,) = exe(x)
    check_int8(got, x, w, scales, biases, 64, 8, mx.float32)
    np.testing.assert_array_equal(np.array(got), np.array(int8_qmm(ext, x, w, scales, biases,
                                                                     64, 8)))
    assert exe.stats.native_ops == {"quantized_matmul": 1}
    assert exe.stats.numerics_fallbacks == {}


def test_program_exact_is_the_default(ext):
    rng = np.random.default_rng(13)
    w, scales, biases = quantized(rng, (16, 64), mx.float32, 32, 4)
    prog = qmm_program((1, 64), w, scales, biases, group_size=32, bits=4)
    assert "numerics" not in prog.to_dict()["instructions"][0].get("attrs", {})
    exe = mp.compile(prog, captures={"w": w, "s": scales, "b": biases})
    x = mx.array(rng.standard_normal((1, 64)).astype(np.float32))
    want = mx.quantized_matmul(x, w, scales, biases, group_size=32, bits=4)
    np.testing.assert_allclose(f64(exe(x)[0]), f64(want), rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("case, reason", [
    ("bits", "int8 numerics need 4- or 8-bit codes, found 2"),
    ("transpose", "int8 numerics need transpose=true"),
    ("native_off", "native kernels are off for this executable"),
    ("gpu", "native kernels run on the CPU only"),
])
def test_numerics_fallback_is_exact_and_counted(ext, monkeypatch, case, reason):
    rng = np.random.default_rng(14)
    bits = 2 if case == "bits" else 4
    transpose = case != "transpose"
    w, scales, biases = quantized(rng, (64, 64), mx.float32, 32, bits)
    prog = qmm_program((3, 64), w, scales, biases, group_size=32, bits=bits,
                       transpose=transpose, numerics="int8")
    exe = mp.compile(prog, captures={"w": w, "s": scales, "b": biases},
                     native=case != "native_off")
    x = mx.array(rng.standard_normal((3, 64)).astype(np.float32))
    if case == "gpu":  # as the op sees it on a GPU backend (MLX's op still runs here)
        monkeypatch.setattr(native.mx, "default_device", lambda: mx.Device(mx.gpu))
    (got,) = exe(x)
    monkeypatch.undo()
    want = mx.quantized_matmul(x, w, scales, biases, transpose=transpose, group_size=32,
                               bits=bits)
    np.testing.assert_allclose(f64(got), f64(want), rtol=2e-5, atol=1e-4)
    [entry] = exe.stats.as_dict()["numerics_fallbacks"]
    assert entry["op"] == "quantized_matmul" and entry["count"] == 1
    assert reason in entry["reason"]


def test_numerics_attribute_is_validated():
    w, scales, biases = mx.quantize(mx.ones((8, 64)), group_size=32, bits=4)
    with pytest.raises(mp.ValidationError, match="numerics"):
        qmm_program((1, 64), w, scales, biases, group_size=32, bits=4, numerics="int4")


def test_gather_qmm_has_no_numerics_attribute():
    b = mp.ProgramBuilder("g")
    x = b.input("x", (1, 1, 64), "float32")
    w = b.capture("w", (2, 8, 8), "uint32")
    s = b.capture("s", (2, 8, 2), "float32")
    with pytest.raises(mp.ValidationError, match="numerics"):
        b.gather_qmm(x, w, s, s, group_size=32, bits=4, numerics="int8")


def test_inspect_coverage_follows_numerics(ext):
    """``native_coverage`` (what ``mlxprog inspect`` reports) asks the int8
    kernel's question for int8 instructions."""
    from mlxprog.arrays import AVal
    from mlxprog.ops.quant import QuantizedMatmulAttrs, _native_quantized_matmul

    avals = [AVal((1, 64), mx.float32), AVal((8, 4), mx.uint32), AVal((8, 2), mx.float32),
             AVal((8, 2), mx.float32)]
    two_bit = QuantizedMatmulAttrs(group_size=32, bits=2, numerics="int8")
    assert not _native_quantized_matmul(avals, two_bit)
    assert _native_quantized_matmul(avals, QuantizedMatmulAttrs(group_size=32, bits=2))
    assert kernels.int8_uncovered_reason(*avals, True, 32, 2, "affine")


# -- gather_quantized_matmul: the int8 numerics on MLX-quantized experts ----------------


def gathered_program(x, w, scales, biases, indices, **attrs) -> mp.Program:
    """A one-instruction program: gather_quantized_matmul of its inputs."""
    b = mp.ProgramBuilder("experts")
    values = [b.input(name, a.shape, str(a.dtype).split(".")[-1])
              for name, a in zip("xwsbi", (x, w, scales, biases, indices))]
    return b.build([b.gather_quantized_matmul(*values, **attrs)])


@pytest.mark.parametrize("per_slot", [False, True])
@pytest.mark.parametrize("tokens", [1, 3, 40])
@pytest.mark.parametrize("numerics, bits", [("int8", 4), ("int8", 8), ("exact", 3),
                                            ("exact", 4)])
def test_gathered_is_the_dense_kernel_on_each_expert(ext, isa, numerics, bits, tokens,
                                                     per_slot):
    """Each chosen expert's slots go through the native quantized matmul
    once: the same results, bit for bit, as that kernel on the expert alone
    (whose own tests check its numerics against float64 references); expert
    0 is chosen by no slot, expert 1 by every token's first."""
    rng = np.random.default_rng(bits * 100 + tokens)
    experts, k, n, features = 6, 3, 24, 128
    w, scales, biases = quantized(rng, (experts, n, features), mx.float32, 32, bits)
    x = rng.standard_normal((tokens, k, features) if per_slot else (tokens, features))
    x = mx.array(x.astype(np.float32))
    indices = rng.integers(2, experts, (tokens, k)).astype(np.uint32)
    indices[:, 0] = 1
    prog = gathered_program(x, w, scales, biases, mx.array(indices), group_size=32, bits=bits,
                            per_slot=per_slot, numerics=numerics)
    exe = mp.compile(prog)
    (got,) = exe(x, w, scales, biases, mx.array(indices))
    assert exe.stats.native_ops.get("gather_quantized_matmul") == 1
    assert got.shape == (tokens, k, n) and got.dtype == mx.float32
    rows = np.array(x) if per_slot else np.broadcast_to(np.array(x)[:, None], (tokens, k, features))
    got = np.array(got)
    for e in range(1, experts):
        picked = indices == e
        if picked.any():
            want = ext.quantized_matmul(mx.array(np.ascontiguousarray(rows[picked])), w[e],
                                        scales[e], biases[e], transpose=True, group_size=32,
                                        bits=bits, int8=numerics == "int8")
            np.testing.assert_array_equal(got[picked], np.array(want))


@pytest.mark.parametrize("case, reason", [
    ("bits", "int8 numerics need 4- or 8-bit codes, found 3"),
    ("mode", "int8 numerics need mode 'affine', found 'mxfp4'"),
    ("native_off", "native kernels are off for this executable"),
])
def test_gathered_int8_fallback_is_exact_and_counted(ext, case, reason):
    rng = np.random.default_rng(15)
    mode, bits = ("mxfp4", 4) if case == "mode" else ("affine", 3 if case == "bits" else 4)
    parts = mx.quantize(mx.array(rng.standard_normal((4, 16, 64)).astype(np.float32)),
                        group_size=32, bits=bits, mode=mode)
    x = mx.array(rng.standard_normal((2, 64)).astype(np.float32))
    indices = mx.array([[0, 3], [2, 2]], dtype=mx.uint32)
    b = mp.ProgramBuilder("experts")
    values = [b.input(f"a{i}", a.shape, str(a.dtype).split(".")[-1])
              for i, a in enumerate((x, *parts, indices))]
    prog = b.build([b.gather_quantized_matmul(*values, group_size=32, bits=bits, mode=mode,
                                              numerics="int8")])
    exe = mp.compile(prog, native=case != "native_off")
    (got,) = exe(x, *parts, indices)
    want = mx.gather_qmm(x[:, None, None, :], *parts, rhs_indices=indices, transpose=True,
                         group_size=32, bits=bits, mode=mode)
    np.testing.assert_allclose(f64(got), f64(want[..., 0, :]), rtol=2e-5, atol=1e-4)
    [entry] = exe.stats.as_dict()["numerics_fallbacks"]
    assert entry["op"] == "gather_quantized_matmul" and reason in entry["reason"]
