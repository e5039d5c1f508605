"""Window ops against loop-based numpy references, compiled (and a sample eagerly)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from helpers import assert_close, assert_invalid, run_op

RNG = np.random.default_rng(3)


def _counts(shape, dims, strides, pads, dilations):
    return [
        (d + lo + hi - (w - 1) * r - 1) // s + 1
        for d, w, s, (lo, hi), r in zip(shape, dims, strides, pads, dilations)
    ]


def np_reduce_window(x, reduce, identity, dims, strides, pads, dilations):
    padded = np.pad(x, pads, constant_values=identity)
    counts = _counts(x.shape, dims, strides, pads, dilations)
    out = np.empty(counts, np.float64)
    for o in np.ndindex(*counts):
        values = [
            padded[tuple(oi * s + ki * r for oi, ki, s, r in zip(o, k, strides, dilations))]
            for k in np.ndindex(*dims)
        ]
        out[o] = reduce(values)
    return out


def np_select_and_scatter(x, source, init, dims, strides, pads, select_max):
    """XLA's semantics: padding positions are never selected; first best wins."""
    out = np.full(x.shape, init, x.dtype)
    for o in np.ndindex(*source.shape):
        best = None
        for k in np.ndindex(*dims):
            pos = tuple(oi * s + ki - lo for oi, ki, s, (lo, _) in zip(o, k, strides, pads))
            if not all(0 <= p < d for p, d in zip(pos, x.shape)):
                continue
            if best is None or (x[pos] > x[best] if select_max else x[pos] < x[best]):
                best = pos
        if best is not None:
            out[best] += source[o]
    return out


REDUCTIONS = {
    "window_sum": (np.sum, lambda dt: 0),
    "window_product": (np.prod, lambda dt: 1),
    "window_max": (np.max, lambda dt: -np.inf if dt.kind == "f" else np.iinfo(dt).min),
    "window_min": (np.min, lambda dt: np.inf if dt.kind == "f" else np.iinfo(dt).max),
}

CONFIGS = [
    # shape, window_dimensions, window_strides, padding, window_dilations
    ((5, 6), [2, 3], None, None, None),
    ((5, 6), [2, 2], [2, 3], [[1, 0], [2, 1]], [2, 1]),
    ((7,), [3], [2], [[2, 2]], [3]),
    ((1, 5, 4, 2), [1, 3, 3, 1], [1, 2, 1, 1], [[0, 0], [1, 1], [0, 2], [0, 0]], [1, 1, 2, 1]),
]


@pytest.mark.parametrize("op", list(REDUCTIONS))
@pytest.mark.parametrize("shape, dims, strides, padding, dilations", CONFIGS)
def test_window_reductions(op, shape, dims, strides, padding, dilations):
    x = (RNG.standard_normal(shape) * 0.8 + 0.3).astype(np.float32)
    attrs = {"window_dimensions": dims}
    for name, value in [("window_strides", strides), ("padding", padding),
                        ("window_dilations", dilations)]:
        if value is not None:
            attrs[name] = value
    reduce, identity = REDUCTIONS[op]
    ones = [1] * len(shape)
    pads = [tuple(p) for p in padding] if padding else [(0, 0)] * len(shape)
    expected = np_reduce_window(x, reduce, identity(x.dtype), dims, strides or ones, pads,
                                dilations or ones)
    assert_close(run_op(op, x, **attrs), expected, rtol=1e-4, atol=1e-5, dtype=mx.float32)


@pytest.mark.parametrize("op", ["window_max", "window_min"])
@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.int8])
def test_window_extremes_pad_with_integer_limits(op, dtype):
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max, size=(4, 3), endpoint=True).astype(dtype)
    reduce, identity = REDUCTIONS[op]
    expected = np_reduce_window(x, reduce, identity(x.dtype), [3, 2], [1, 1],
                                [(2, 1), (1, 1)], [1, 1])
    got = run_op(op, x, window_dimensions=[3, 2], padding=[[2, 1], [1, 1]])
    assert_close(got, expected.astype(dtype), dtype=mx.array(x).dtype)


def test_window_sum_dtype_follows_mx_sum_eager():
    x = np.arange(12, dtype=np.int8).reshape(3, 4)
    got = run_op("window_sum", x, window_dimensions=[2, 2], window_strides=[1, 2], eager=True)
    expected = np_reduce_window(x, np.sum, 0, [2, 2], [1, 2], [(0, 0)] * 2, [1, 1])
    assert_close(got, expected.astype(np.int32), dtype=mx.sum(mx.array(x)).dtype)


def test_window_max_propagates_nan():
    x = np.array([1.0, np.nan, 3.0, 0.0], np.float32)
    got = run_op("window_max", x, window_dimensions=[2])
    assert_close(got, [np.nan, np.nan, 3.0])


SCATTER_CONFIGS = [
    # shape, window_dimensions, window_strides, padding
    ((4, 6), [2, 2], [2, 2], None),
    ((5, 5), [3, 2], [2, 1], [[1, 1], [0, 1]]),
    ((1, 4, 5, 2), [1, 3, 3, 1], [1, 2, 2, 1], [[0, 0], [1, 1], [1, 1], [0, 0]]),
]


@pytest.mark.parametrize("op", ["window_scatter_max", "window_scatter_min"])
@pytest.mark.parametrize("shape, dims, strides, padding", SCATTER_CONFIGS)
@pytest.mark.parametrize("sign", [1, -1])
def test_window_scatter(op, shape, dims, strides, padding, sign):
    # Distinct values (no ties); all of one sign, so padding filled with a 0 init
    # value would win and lose gradient, unlike XLA's semantics tested here.
    x = sign * (RNG.permutation(int(np.prod(shape))).reshape(shape) + 1).astype(np.float32)
    pads = [tuple(p) for p in padding] if padding else [(0, 0)] * len(shape)
    counts = _counts(shape, dims, strides, pads, [1] * len(shape))
    source = RNG.standard_normal(counts).astype(np.float32)
    attrs = {"window_dimensions": dims, "window_strides": strides}
    if padding:
        attrs["padding"] = padding
    got = run_op(op, x, source, np.float32(0.5), **attrs)
    expected = np_select_and_scatter(x, source, 0.5, dims, strides, pads,
                                     select_max=op == "window_scatter_max")
    assert_close(got, expected, atol=1e-5, dtype=mx.float32)


@pytest.mark.parametrize("op", ["window_scatter_max", "window_scatter_min"])
def test_window_scatter_ties_go_to_first_eager(op):
    x = np.zeros((4, 4), np.int32)
    source = np.array([[1, 2], [3, 4]], np.int32)
    got = run_op(op, x, source, np.int32(0), window_dimensions=[2, 2], window_strides=[2, 2],
                 eager=True)
    expected = np.zeros((4, 4), np.int32)
    expected[::2, ::2] = source
    assert_close(got, expected, dtype=mx.int32)


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("op", ["window_scatter_max", "window_scatter_min"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_window_scatter_padding_never_wins_a_tie(op, dtype, eager):
    # The real elements equal the padding value (-inf / +inf, or the integer
    # extreme): the source value still lands on the first real element.
    low = -np.inf if dtype == np.float32 else np.iinfo(dtype).min
    x = np.array([low, low, 1, 2], dtype)
    if op == "window_scatter_min":
        x = np.array([-low if dtype == np.float32 else np.iinfo(dtype).max] * 2 + [2, 1],
                     dtype)
    source = np.array([10, 20, 30], dtype)
    got = run_op(op, x, source, dtype(0), window_dimensions=[2], window_strides=[2],
                 padding=[[1, 1]], eager=eager)
    assert_close(got, np.array([10, 0, 20, 30], dtype))


def test_window_scatter_nan_is_selected_and_padding_only_windows_drop():
    got = run_op("window_scatter_max", np.array([1, np.nan, 3], np.float32),
                 np.array([1, 2], np.float32), np.float32(0), window_dimensions=[2])
    assert_close(got, [0, 3, 0])
    # Windows of padding only (the first and the last) select nothing.
    got = run_op("window_scatter_max", np.array([1, 2], np.float32),
                 np.array([1, 2, 3, 4], np.float32), np.float32(0), window_dimensions=[1],
                 padding=[[1, 1]])
    assert_close(got, [2, 3])


def _view_program(view_op: str, window_op: str, shape, view_attrs, window_attrs,
                  extra=()) -> mp.Program:
    """``window_op`` applied to the result of ``view_op`` (which MLX makes a
    non-contiguous view of the input)."""
    b = mp.ProgramBuilder("view")
    x = b.input("x", shape, "float32")
    operands = [b.input(f"e{i}", a.shape, "float32") for i, a in enumerate(extra)]
    return b.build([b.op(window_op, b.op(view_op, x, **view_attrs), *operands, **window_attrs)])


VIEWS = [
    # a view, its numpy equivalent
    ("reverse", (8,), {"axes": [0]}, lambda x: x[::-1]),
    ("slice", (8,), {"lengths": [8], "strides": [2]}, lambda x: x[::2]),
    ("slice", (4, 6), {"lengths": [4, 6], "strides": [1, 2]}, lambda x: x[:, ::2]),
    ("transpose", (4, 6), {"axes": [1, 0]}, lambda x: x.T),
]


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("op", list(REDUCTIONS))
@pytest.mark.parametrize("view, shape, view_attrs, np_view", VIEWS)
def test_window_reductions_of_views(op, view, shape, view_attrs, np_view, eager):
    x = RNG.standard_normal(shape).astype(np.float32)
    viewed = np_view(x)
    dims, strides = [2] * viewed.ndim, [1] * (viewed.ndim - 1) + [2]
    attrs = {"window_dimensions": dims, "window_strides": strides}
    prog = _view_program(view, op, shape, view_attrs, attrs)
    (got,) = mp.run(prog, mx.array(x), eager=eager)
    reduce, identity = REDUCTIONS[op]
    ones = [1] * viewed.ndim
    expected = np_reduce_window(viewed, reduce, identity(x.dtype), dims, strides,
                                [(0, 0)] * viewed.ndim, ones)
    assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("view, shape, view_attrs, np_view", VIEWS)
def test_window_scatter_of_views(view, shape, view_attrs, np_view, eager):
    x = RNG.permutation(int(np.prod(shape))).reshape(shape).astype(np.float32)
    viewed = np_view(x)
    dims = [2] * viewed.ndim
    counts = _counts(viewed.shape, dims, dims, [(0, 0)] * viewed.ndim, [1] * viewed.ndim)
    source = RNG.standard_normal(counts).astype(np.float32)
    init = np.zeros((), np.float32)
    prog = _view_program(view, "window_scatter_max", shape, view_attrs,
                         {"window_dimensions": dims, "window_strides": dims},
                         extra=[source, init])
    (got,) = mp.run(prog, mx.array(x), mx.array(source), mx.array(init), eager=eager)
    expected = np_select_and_scatter(viewed, source, 0, dims, dims,
                                     [(0, 0)] * viewed.ndim, select_max=True)
    assert_close(got, expected, atol=1e-6)


X = np.zeros((4, 5), np.float32)

INVALID = [
    ("window_sum", [X], {"window_dimensions": [2]}, "window_dimensions needs one entry per axis"),
    ("window_max", [X], {"window_dimensions": [2, 2], "window_strides": [1]},
     "window_strides needs one entry per axis of operand 0 (rank 2); found 1"),
    ("window_min", [X], {"window_dimensions": [2, 2], "padding": [[0, 0]]},
     "padding needs one entry"),
    ("window_sum", [X], {"window_dimensions": [2, 2], "window_dilations": [1, 1, 1]},
     "window_dilations needs one entry"),
    ("window_sum", [X], {"window_dimensions": [2, -1]}, "greater than or equal to 1"),
    ("window_sum", [X], {"window_dimensions": [2, 2], "window_strides": [0, 1]},
     "greater than or equal to 1"),
    ("window_sum", [X], {"window_dimensions": [2, 2], "padding": [[0, -1], [0, 0]]},
     "greater than or equal to 0"),
    ("window_product", [X], {"window_dimensions": [5, 2]},
     "axis 0: the window spans 5 element(s) but the padded operand has 4"),
    ("window_max", [X], {"window_dimensions": [2, 2], "window_dilations": [4, 1]},
     "axis 0: the window spans 5 element(s)"),
    ("window_scatter_max", [X, np.zeros((2, 3), np.float32), np.float32(0)],
     {"window_dimensions": [2, 2], "window_strides": [2, 2]},
     "source (operand 1) must have one element per window, shape [2, 2]; found [2, 3]"),
    ("window_scatter_min", [X, np.zeros((3, 4), np.float32), np.zeros(1, np.float32)],
     {"window_dimensions": [2, 2]}, "init value (operand 2) must be a scalar"),
    ("window_scatter_max", [X, np.zeros((3, 4), np.float32), np.float32(0)],
     {"window_dimensions": [2, 2], "window_dilations": [1, 1]}, "unknown attribute"),
]


@pytest.mark.parametrize("op, operands, attrs, message", INVALID)
def test_invalid(op, operands, attrs, message):
    assert_invalid(message, op, *operands, **attrs)
