"""Reductions, scans, sorting and softmax against numpy references, run through
compiled one-op programs (and a sample eagerly).

Ops that MLX builds from several elementwise primitives (``mean``, ``var``,
``std``, ``logsumexp``, the NaN handling of ``sort``) make ``mx.compile`` build a
C++ kernel per dtype, layout and reduction size, about a second each on a cold
kernel cache, so they get fewer attribute combinations than the single-primitive
reductions.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import mlxprog as mp
from helpers import assert_close, assert_invalid, one_op_program, run_op

FAST = settings(max_examples=25, deadline=None)

RNG = np.random.default_rng(11)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)


def np_logsumexp(x, axis=None, keepdims=False):
    peak = np.max(x, axis=axis, keepdims=True)
    total = np.sum(np.exp(x - peak), axis=axis, keepdims=True)
    out = np.log(total) + peak
    return out if keepdims else np.squeeze(out, axis=axis)


# --- axis reductions -----------------------------------------------------------------

PRIMITIVE_REDUCTIONS = {
    "sum": np.sum,
    "product": np.prod,
    "all": np.all,
    "any": np.any,
    "reduce_max": np.max,
    "reduce_min": np.min,
}
COMPOSITE_REDUCTIONS = {"mean": np.mean, "logsumexp": np_logsumexp}
REDUCTIONS = PRIMITIVE_REDUCTIONS | COMPOSITE_REDUCTIONS
ALL_AXES = [None, [0], [-1], [0, 2], []]


@pytest.mark.parametrize(
    "op, axes, keepdims",
    [
        (op, axes, keepdims)
        for op in sorted(PRIMITIVE_REDUCTIONS)
        for axes in ALL_AXES
        for keepdims in (False, True)
    ]
    + [
        (op, axes, keepdims)
        for op in sorted(COMPOSITE_REDUCTIONS)
        for axes, keepdims in ((None, False), ([0, 2], True))
    ],
)
def test_reduction(op, axes, keepdims):
    x = (X > 0.3) if op in ("all", "any") else X
    attrs = {"keepdims": keepdims} if axes is None else {"axes": axes, "keepdims": keepdims}
    got = run_op(op, x, **attrs)
    axis = None if axes is None else tuple(axes)
    expected = REDUCTIONS[op](x.astype(np.float64) if x.dtype != bool else x, axis=axis,
                              keepdims=keepdims)
    assert_close(got, expected, rtol=1e-5, atol=1e-5,
                 dtype=mx.bool_ if op in ("all", "any") else mx.float32)


@FAST
@given(hnp.arrays(np.int32, hnp.array_shapes(max_dims=3, max_side=4),
                  elements=st.integers(-5, 5)), st.data())
def test_integer_reductions(x, data):
    axes = data.draw(st.none() | st.lists(st.integers(0, x.ndim - 1), unique=True))
    keepdims = data.draw(st.booleans())
    axis = None if axes is None else tuple(axes)
    attrs = {"keepdims": keepdims} if axes is None else {"axes": axes, "keepdims": keepdims}
    for op in ("sum", "reduce_max", "any"):
        if op == "reduce_max" and x.size == 0:
            continue  # the maximum of nothing is undefined
        assert_close(run_op(op, x, **attrs), REDUCTIONS[op](x, axis=axis, keepdims=keepdims))


@pytest.mark.parametrize(
    "op, dtype, expected",
    [
        ("sum", np.int8, mx.int32),
        ("sum", np.bool_, mx.int32),
        ("sum", np.uint8, mx.uint32),
        ("sum", np.int64, mx.int64),
        ("sum", np.float16, mx.float16),
        ("product", np.int16, mx.int32),
        ("mean", np.int32, mx.float32),
        ("reduce_max", np.uint8, mx.uint8),
        ("all", np.float32, mx.bool_),
    ],
)
def test_reduction_dtypes_follow_mlx(op, dtype, expected):
    x = np.array([[1, 2, 0], [3, 1, 1]], dtype)
    got = run_op(op, x, axes=[1])
    assert_close(got, REDUCTIONS[op](x.astype(np.float64), axis=1), dtype=expected)


def test_reductions_propagate_nan_and_logsumexp_is_stable():
    x = np.array([1.0, np.nan, 3.0], np.float32)
    assert_close(run_op("reduce_max", x), np.nan)
    assert_close(run_op("reduce_min", x), np.nan)
    big = np.array([1000.0, 1000.0], np.float32)
    assert_close(run_op("logsumexp", big), 1000 + math.log(2), dtype=mx.float32)


@pytest.mark.parametrize(
    "op, reference, axes, ddof",
    [("var", np.var, [1], 1), ("std", np.std, [0, -1], 2)],
)
def test_variance(op, reference, axes, ddof):
    attrs = {"ddof": ddof, "keepdims": True}
    if axes is not None:
        attrs["axes"] = axes
    got = run_op(op, X, **attrs)
    expected = reference(X.astype(np.float64), axis=None if axes is None else tuple(axes),
                         ddof=ddof, keepdims=True)
    assert_close(got, expected, rtol=1e-5, atol=1e-6, dtype=mx.float32)


def test_reduction_invalid():
    assert_invalid("axis 3 is out of range for an operand of rank 3", "sum", X, axes=[3])
    assert_invalid("name an axis twice", "mean", X, axes=[1, -2])
    assert_invalid("attribute 'axes'", "product", X, axes=1)
    assert_invalid("attribute 'ddof'", "var", X, ddof=-1)
    assert_invalid("unknown attribute", "sum", X, axis=0)


# Made by MLX: MLX 0.32.4 reduces an mx.array converted from a zero-size numpy
# array wrongly (product 0, all false).
EMPTY = mx.zeros((2, 0, 3))


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize(
    "op, attrs, expected",
    [
        ("sum", {"axes": [1]}, np.zeros((2, 3))),
        ("product", {}, np.float32(1)),
        ("all", {"axes": [1]}, np.ones((2, 3), bool)),
        ("any", {}, np.False_),
        ("mean", {"axes": [1]}, np.full((2, 3), np.nan)),
        ("var", {"axes": [0, 1]}, np.full(3, np.nan)),
        ("std", {"axes": [1], "ddof": 1}, np.full((2, 3), np.nan)),
        # Empty results where the empty axis is not reduced.
        ("reduce_max", {"axes": [2]}, np.zeros((2, 0))),
        ("reduce_min", {"axes": [0, 2], "keepdims": True}, np.zeros((1, 0, 1))),
        ("softmax", {}, np.zeros((2, 0, 3))),
    ],
)
def test_reductions_over_no_elements(op, attrs, expected, eager):
    got = run_op(op, EMPTY, eager=eager, **attrs)
    assert_close(got, expected)


@pytest.mark.parametrize(
    "op, attrs, message",
    [
        ("reduce_max", {"axes": [1]}, "a reduction over no elements has no value: axis 1 of "
                                      "operand 0 float32[2, 0, 3] is empty"),
        ("reduce_min", {}, "axis 1 of operand 0 float32[2, 0, 3] is empty"),
        ("argmax", {"axis": 1}, "a reduction over no elements has no value"),
        ("argmin", {}, "a reduction over no elements has no value"),
        ("logsumexp", {"axes": [0, 1]}, "a reduction over no elements has no value"),
        # MLX computes these of no zero-size array, even over a non-empty axis.
        ("argmax", {"axis": 2}, "MLX cannot compute this reduction of a zero-size operand, "
                                "even over non-empty axes; found float32[2, 0, 3]"),
        ("logsumexp", {"axes": [2]}, "zero-size operand"),
    ],
)
def test_reductions_without_a_value_are_rejected(op, attrs, message):
    assert_invalid(message, op, EMPTY, **attrs)


def test_empty_reduction_is_rejected_at_a_zero_binding():
    b = mp.ProgramBuilder("empty")
    x = b.input("x", (2, b.dim("T", min=0)), "float32")
    prog = b.build([b.op("reduce_max", x, axes=[1])])
    run = mp.compile(prog)
    assert_close(run(mx.ones((2, 3)))[0], np.ones(2))
    with pytest.raises(mp.ValidationError, match="axis 1 of operand 0 float32.2, 0. is empty"):
        run(mx.zeros((2, 0)))


def test_variance_with_too_few_elements_divides_by_zero():
    x = np.array([[1, 2], [3, 3]], np.float32)
    assert_close(run_op("var", x, axes=[1], ddof=2), [np.inf, np.nan])
    assert_close(run_op("std", x, axes=[1], ddof=3, eager=True), [np.inf, np.nan])


# --- argmax, argmin ------------------------------------------------------------------


@pytest.mark.parametrize("op, reference", [("argmax", np.argmax), ("argmin", np.argmin)])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_arg_reduction(op, reference, axis, keepdims):
    x = RNG.integers(0, 3, size=(3, 5)).astype(np.float32)  # ties: the first index wins
    attrs = {"keepdims": keepdims} if axis is None else {"axis": axis, "keepdims": keepdims}
    expected = reference(x, axis=axis, keepdims=keepdims)
    assert_close(run_op(op, x, **attrs), expected, dtype=mx.uint32)


def test_arg_reduction_invalid():
    assert_invalid("axis 2 is out of range for an operand of rank 2", "argmax", X[0], axis=2)
    assert_invalid("attribute 'axis'", "argmin", X, axis=[0])


# --- cumulative ----------------------------------------------------------------------

SCANS = {
    "cumulative_sum": (np.cumsum, 0),
    "cumulative_product": (np.cumprod, 1),
    "cumulative_min": (np.minimum.accumulate, np.inf),
    "cumulative_max": (np.maximum.accumulate, -np.inf),
}


def np_scan(op, x, axis, reverse, inclusive):
    scan, identity = SCANS[op]
    if axis is None:
        x, axis = x.reshape(-1), 0
    if reverse:
        x = np.flip(x, axis)
    out = scan(x, axis=axis)
    if not inclusive:
        start = np.full_like(np.take(out, [0], axis=axis), identity)
        out = np.concatenate([start, np.delete(out, -1, axis=axis)], axis=axis)
    return np.flip(out, axis) if reverse else out


@pytest.mark.parametrize("op", sorted(SCANS))
@pytest.mark.parametrize(
    "axis, reverse, inclusive",
    [(None, False, True), (0, False, True), (-1, True, True), (1, False, False), (2, True, False)],
)
def test_scan(op, axis, reverse, inclusive):
    attrs = {"reverse": reverse, "inclusive": inclusive}
    if axis is not None:
        attrs["axis"] = axis
    got = run_op(op, X, **attrs)
    assert_close(got, np_scan(op, X.astype(np.float64), axis, reverse, inclusive),
                 rtol=1e-5, atol=1e-5, dtype=mx.float32)


def test_scan_integers():
    x = np.array([[3, -1, 2], [5, 4, -6]], np.int32)
    assert_close(run_op("cumulative_sum", x, axis=1), np.cumsum(x, axis=1), dtype=mx.int32)
    assert_close(run_op("cumulative_max", x, axis=0, reverse=True),
                 np.flip(np.maximum.accumulate(np.flip(x, 0), axis=0), 0), dtype=mx.int32)


def test_scan_invalid():
    assert_invalid("axis -4 is out of range", "cumulative_sum", X, axis=-4)
    assert_invalid("attribute 'inclusive'", "cumulative_max", X, axis=0, inclusive="maybe")


# --- sort, argsort ----------------------------------------------------------------------


def np_argsort(x, axis, descending):
    """Stable argsort along ``axis``; NaNs last ascending, first descending."""
    def order(row):
        def key(i):
            value = row[i].item()
            if isinstance(value, float) and math.isnan(value):
                return (0 if descending else 2, 0)
            return (1, -value if descending else value)
        return np.array(sorted(range(len(row)), key=key), np.int64)

    return np.apply_along_axis(order, axis, x)


NAN = np.nan
SORT_CASES = [
    np.array([3.0, NAN, 1.0, 2.0, NAN, -np.inf, 1.0, np.inf, -0.0, 0.0], np.float32),
    np.array([3, -128, 127, 0, 3, -1], np.int8),
    np.array([0, 255, 7, 0, 255], np.uint8),
    np.array([True, False, True, False]),
    np.array([[2.0, NAN, 1.0], [NAN, NAN, 0.5]], np.float32),
]


@pytest.mark.parametrize("x", SORT_CASES, ids=lambda x: str(x.dtype))
@pytest.mark.parametrize("descending", [False, True])
def test_sort_and_argsort(x, descending):
    expected_order = np_argsort(x, -1, descending)
    order = run_op("argsort", x, descending=descending)
    assert_close(order, expected_order, dtype=mx.uint32)
    values = run_op("sort", x, descending=descending)
    assert_close(values, np.take_along_axis(x, expected_order, -1), dtype=mx.array(x).dtype)


def test_sort_ascending_matches_numpy_with_nans():
    x = np.array([[NAN, 2.0, -1.0], [0.5, NAN, NAN]], np.float32)
    assert_close(run_op("sort", x), np.sort(x, axis=-1))


@FAST
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=5),
                  elements=st.sampled_from([NAN, -np.inf, -1.5, 0.0, 2.0, 3.0, np.inf])),
       st.booleans(), st.data())
def test_argsort_matches_reference(x, descending, data):
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    got = run_op("argsort", x, axis=axis, descending=descending)
    assert_close(got, np_argsort(x, axis, descending), dtype=mx.uint32)


def test_sort_invalid():
    assert_invalid("axis -1 is out of range for an operand of rank 0", "sort", np.float32(1))
    assert_invalid("axis 2 is out of range", "argsort", X[0], axis=2)


# --- softmax ---------------------------------------------------------------------------


def np_softmax(x, axis):
    shifted = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return shifted / np.sum(shifted, axis=axis, keepdims=True)


@pytest.mark.parametrize("axes", [None, [-1], [0, 2]])
def test_softmax(axes):
    attrs = {} if axes is None else {"axes": axes}
    got = run_op("softmax", X, **attrs)
    expected = np_softmax(X.astype(np.float64), None if axes is None else tuple(axes))
    assert_close(got, expected, rtol=1e-5, atol=1e-6, dtype=mx.float32)


@pytest.mark.parametrize("precise", [False, True])
def test_softmax_half_precision(precise):
    x = (X * 4).astype(np.float16)
    got = run_op("softmax", x, axes=[-1], precise=precise)
    assert_close(got, np_softmax(x.astype(np.float64), -1), rtol=1e-2, atol=1e-3,
                 dtype=mx.float16)


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("dtype", [np.uint32, np.int8, np.int64, np.bool_])
@pytest.mark.parametrize("axes", [None, [-1]])
def test_softmax_of_integers_is_float32(dtype, axes, eager):
    # mx.softmax over all axes keeps the integer dtype, compiled [[0, 0], [0, 0]]
    # and eager [[2147483648, 0], [0, 2147483648]] for uint32.
    x = np.array([[0, 1], [1, 0]], dtype)
    attrs = {} if axes is None else {"axes": axes}
    got = run_op("softmax", x, eager=eager, **attrs)
    expected = np_softmax(x.astype(np.float64), None if axes is None else tuple(axes))
    assert_close(got, expected, rtol=1e-6, dtype=mx.float32)


def test_softmax_invalid():
    assert_invalid("axis 5 is out of range", "softmax", X, axes=[5])


# --- normalisation, eager ----------------------------------------------------------------


@pytest.mark.parametrize(
    "op, attrs, field, expected",
    [
        ("sum", {"axes": [-1, 0]}, "axes", (2, 0)),
        ("argmax", {"axis": -2}, "axis", 1),
        ("cumulative_sum", {"axis": -1}, "axis", 2),
        ("sort", {}, "axis", 2),
        ("softmax", {"axes": [-1]}, "axes", (2,)),
    ],
)
def test_negative_axes_are_normalised(op, attrs, field, expected):
    step = mp.validate(one_op_program(op, X, **attrs)).block.steps[0]
    assert getattr(step.attrs, field) == expected


@pytest.mark.parametrize(
    "op, attrs",
    [
        ("sort", {"descending": True}),
        ("argsort", {"axis": 0}),
        ("var", {"axes": [1], "ddof": 1}),
        ("cumulative_product", {"axis": 2, "reverse": True, "inclusive": False}),
        ("logsumexp", {"axes": [0, 2], "keepdims": True}),
    ],
)
def test_eager_agrees_with_compiled(op, attrs):
    x = X.copy()
    x[0, 1, 2] = np.nan
    compiled = run_op(op, x, **attrs)
    eager = run_op(op, x, eager=True, **attrs)
    np.testing.assert_allclose(np.array(eager), np.array(compiled), rtol=1e-6, equal_nan=True)
