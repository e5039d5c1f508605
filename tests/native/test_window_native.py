"""The native window reductions (src/kernels/portable/window.h,
src/primitives/window.cpp) against the MLX lowering of the window ops (native
off: a padded copy, a strided view and an MLX reduction), on every kernel table
this CPU runs; their use by the ``window_*`` ops, inside mx.compile and
shapeless compilation."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from mlxprog import native
from mlxprog.arrays import AVal
from mlxprog.native import kernels
from mlxprog.ops import window

RNG = np.random.default_rng(5)

REDUCTIONS = {"window_sum": mx.sum, "window_product": mx.prod, "window_max": mx.max,
              "window_min": mx.min}


@pytest.fixture(params=["best", "avx2", "portable"])
def table(request, ext):
    """Each kernel table this CPU runs (the AVX2 one also by name, since
    "best" may be a VNNI table)."""
    if request.param not in ("best", *ext.isas()):
        pytest.skip(f"no {request.param} table here")
    ext.set_isa(request.param)
    yield request.param
    ext.set_isa("best")


def values(shape, special: bool) -> mx.array:
    """Normal values; with `special`, about one in six NaN, +inf or -inf."""
    x = RNG.standard_normal(shape).astype(np.float32)
    if special:
        pick = RNG.integers(0, 18, size=shape)
        x[pick == 0] = np.nan
        x[pick == 1] = np.inf
        x[pick == 2] = -np.inf
    return mx.array(x)


def attrs_of(dims, strides=None, padding=None, dilations=None):
    return window.WindowReduceAttrs(window_dimensions=dims, window_strides=strides,
                                    padding=padding, window_dilations=dilations)


def lowered(op: str, x: mx.array, attrs) -> mx.array:
    """The op's MLX lowering (native kernels off)."""
    return window.window_reduce(REDUCTIONS[op], [x], attrs,
                                SimpleNamespace(native=native.Setting(False)))


def run_native(op: str, x: mx.array, attrs, setting=None) -> mx.array:
    out = kernels.window_reduce(setting or native.Setting(True), x,
                                reduction=window._NATIVE_REDUCTION[REDUCTIONS[op]],
                                window=attrs.window_dimensions, strides=attrs.strides,
                                dilations=attrs.dilations, padding=attrs.pads, op=op)
    assert out is not None
    return out


def assert_matches(op: str, got: mx.array, want: mx.array, window_size: int) -> None:
    """max and min exactly (NaN where MLX has NaN); sums and products within
    float32 rounding of another summation order."""
    assert got.shape == want.shape and got.dtype == want.dtype == mx.float32
    g, w = np.array(got), np.array(want)
    if op in ("window_max", "window_min"):
        np.testing.assert_array_equal(g, w)
    else:
        np.testing.assert_allclose(g, w, rtol=2e-6 * window_size + 1e-6,
                                   atol=1e-6 * window_size)


# (shape, window, strides, padding, dilations)
CASES = [
    ((17,), [3], [2], [(1, 2)], None),                       # 1-D
    ((20,), [4], None, None, [3]),                           # 1-D dilated
    ((9, 11), [3, 2], [2, 3], [(2, 0), (1, 1)], None),       # 2-D, window on the last axis
    ((2, 15, 13, 24), [1, 3, 3, 1], [1, 2, 2, 1], [(0, 0), (1, 1), (1, 1), (0, 0)], None),
    ((1, 7, 7, 13), [1, 2, 2, 1], [1, 2, 2, 1], None, None),  # channels not a vector multiple
    ((2, 5, 12, 10), [1, 1, 3, 3], [1, 1, 2, 2], [(0, 0), (0, 0), (1, 0), (0, 1)], None),  # NCHW
    ((1, 12, 12, 16), [1, 3, 3, 1], None, [(0, 0), (2, 2), (2, 2), (0, 0)], [1, 2, 2, 1]),
    ((1, 4, 4, 3), [1, 2, 2, 1], None, [(0, 0), (3, 4), (5, 2), (0, 0)], None),  # pad > window
    ((3, 4, 5), [1, 1, 1], None, None, None),                # window 1: a copy
    ((3, 8, 5), [1, 1, 1], [1, 3, 1], [(0, 0), (1, 0), (0, 0)], None),  # window 1, strided
    ((1, 6, 7, 8, 5), [1, 2, 3, 2, 1], [1, 2, 1, 2, 1],      # 3-D, channels last
     [(0, 0), (1, 0), (0, 2), (1, 1), (0, 0)], [1, 1, 2, 1, 1]),
    ((1, 3, 6, 7, 8), [1, 1, 2, 3, 2], [1, 1, 2, 1, 2], None, None),  # 3-D, channels first
    ((4, 6, 6), [2, 3, 2], [2, 1, 2], [(1, 0), (0, 1), (1, 1)], None),  # every axis windowed
    ((1, 5, 5, 10), [1, 1, 1, 3], [1, 1, 1, 2], [(0, 0), (0, 0), (0, 0), (1, 1)], None),
    ((2, 7, 7, 32), [1, 7, 7, 1], None, None, None),         # global pool
    ((3, 2, 4, 6), [2, 1, 1, 2], [1, 1, 1, 2], [(0, 0), (0, 0), (0, 0), (1, 0)], None),
    ((2, 0, 3), [1, 2, 1], None, [(0, 0), (1, 1), (0, 0)], None),  # padding-only windows
]


@pytest.mark.parametrize("special", [False, True], ids=["normal", "nan_inf"])
@pytest.mark.parametrize("op", list(REDUCTIONS))
@pytest.mark.parametrize("case", CASES, ids=[str(c[0]) for c in CASES])
def test_native_matches_the_mlx_lowering(table, case, op, special):
    shape, dims, strides, padding, dilations = case
    attrs = attrs_of(dims, strides, padding, dilations)
    x = values(shape, special)
    assert_matches(op, run_native(op, x, attrs), lowered(op, x, attrs), int(np.prod(dims)))


@pytest.mark.parametrize("op", list(REDUCTIONS))
def test_non_contiguous_inputs(table, op):
    base = values((2, 9, 10, 12), special=True)
    attrs = attrs_of([1, 3, 3, 1], [1, 2, 2, 1], [(0, 0), (1, 1), (0, 1), (0, 0)])
    views = [
        mx.transpose(values((2, 12, 9, 10), special=False), (0, 2, 3, 1)),  # NCHW seen as NHWC
        base[:, ::-1, :, :],                                              # reversed
        base[:, :, 1:, ::2][..., :5],                                     # strided slices
        mx.broadcast_to(values((1, 9, 10, 1), special=False), (2, 9, 10, 12)),  # stride 0
    ]
    for x in views:
        assert_matches(op, run_native(op, x, attrs), lowered(op, x, attrs), 9)


def test_nan_propagates_like_mlx(ext):
    """A NaN anywhere in a window gives NaN for max and min, whichever comes
    first, and -inf / +inf elements win like the padding values they equal."""
    nan, inf = float("nan"), float("inf")
    x = mx.array([[nan, 1.0, 2.0, -inf, inf, 3.0, nan, nan]], dtype=mx.float32).T
    attrs = attrs_of([2, 1], None, [(1, 1), (0, 0)])
    for op in ("window_max", "window_min"):
        got = np.array(run_native(op, x, attrs)).ravel()
        np.testing.assert_array_equal(got, np.array(lowered(op, x, attrs)).ravel())
        assert np.isnan(got[[0, 1, 6, 7, 8]]).all()
    assert np.array(run_native("window_max", x, attrs)).ravel()[4] == inf


def test_programs_take_the_native_kernel(ext):
    """The four ops count one native instruction each with kernels on, none
    off, and agree; float16 (not covered) runs MLX's lowering."""
    b = mp.ProgramBuilder("pools")
    x = b.input("x", (2, 10, 10, 8), "float32")
    h = b.input("h", (2, 10, 10, 8), "float16")
    pool = dict(window_dimensions=[1, 3, 3, 1], window_strides=[1, 2, 2, 1],
                padding=[(0, 0), (1, 1), (1, 1), (0, 0)])
    outs = [b.op(op, x, **pool) for op in REDUCTIONS] + [b.op("window_max", h, **pool)]
    prog = b.build(outs)
    xv = values((2, 10, 10, 8), special=False)
    results = {}
    for flag in (True, False):
        exe = mp.compile(prog, native=flag)
        results[flag] = exe(xv, xv.astype(mx.float16))
        expected = {op: 1 for op in REDUCTIONS} if flag else {}
        assert exe.stats.native_ops == expected
    for op, got, want in zip([*REDUCTIONS, "window_max"], results[True], results[False]):
        if got.dtype == mx.float16:
            np.testing.assert_array_equal(np.array(got), np.array(want))
        else:
            assert_matches(op, got, want, 9)


def test_inside_compile_and_shapeless_compile(ext):
    setting = native.Setting(True)
    attrs = attrs_of([1, 3, 3, 1], [1, 2, 2, 1], [(0, 0), (1, 1), (1, 1), (0, 0)])

    def f(x):
        return run_native("window_max", x, attrs, setting) * 2.0

    for shapeless in (False, True):
        compiled = mx.compile(f, shapeless=shapeless)
        for shape in ((1, 9, 9, 4), (2, 14, 11, 16)):
            x = values(shape, special=True)
            np.testing.assert_array_equal(np.array(compiled(x)),
                                          np.array(lowered("window_max", x, attrs) * 2.0))


def test_no_native_window_off_the_cpu(ext, monkeypatch):
    on = native.Setting(True)
    monkeypatch.setattr(native.mx, "default_device", lambda: mx.Device(mx.gpu))
    assert kernels.window_reduce(on, mx.ones((1, 4, 4, 2)), reduction="max",
                                 window=[1, 2, 2, 1], strides=[1] * 4, dilations=[1] * 4,
                                 padding=[(0, 0)] * 4, op="window_max") is None
    assert on.counts == {}


def test_coverage_rules():
    """float32 of rank >= 1 only; the ops' native_coverage rule (what
    ``mlxprog inspect`` reports) says the same."""
    f32 = mx.float32
    assert kernels.covers_window_reduce(AVal((1, 8, 8, 4), f32))
    assert kernels.covers_window_reduce(AVal((0, 3), f32))
    assert not kernels.covers_window_reduce(AVal((1, 8, 8, 4), mx.float16))
    assert not kernels.covers_window_reduce(AVal((4,), mx.int32))
    assert not kernels.covers_window_reduce(AVal((), f32))
    spec = mp.lookup("window_max")
    attrs = spec.attrs(window_dimensions=[1, 2, 2, 1])
    assert spec.native_coverage([AVal((1, 8, 8, 4), f32)], attrs)
    assert not spec.native_coverage([AVal((1, 8, 8, 4), mx.bfloat16)], attrs)


def test_bad_arguments_raise(ext):
    x = mx.ones((4, 4), dtype=mx.float32)
    good = dict(window=[2, 2], stride=[1, 1], dilation=[1, 1], pad_low=[0, 0], pad_high=[0, 0])
    with pytest.raises(ValueError, match="no reduction"):
        ext.window_reduce(x, op="mean", **good)
    with pytest.raises(ValueError, match="one entry per axis"):
        ext.window_reduce(x, op="max", **{**good, "stride": [1]})
    with pytest.raises(ValueError, match="does not fit"):
        ext.window_reduce(x, op="max", **{**good, "window": [5, 1]})
    with pytest.raises(ValueError, match="float32"):
        ext.window_reduce(x.astype(mx.float16), op="max", **good)
