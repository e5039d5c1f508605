"""Index ops against numpy references, compiled (and a sample eagerly)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from helpers import assert_close, assert_invalid, one_op_program, run_op

RNG = np.random.default_rng(7)


def _fit(start: int, dim: int, length: int) -> int:
    return min(max(start, 0), dim - length)


def np_slice(x, starts, lengths, strides):
    return x[tuple(
        slice(_fit(s, d, n), _fit(s, d, n) + n, st)
        for s, d, n, st in zip(starts, x.shape, lengths, strides)
    )]


def _wrapped(i: int, dim: int) -> int:
    return i + dim if i < 0 else i


def np_gather(x, indices, axes, sizes):
    rest = [a for a in range(x.ndim) if a not in axes]
    out = np.empty(indices.shape[:-1] + tuple(sizes[a] for a in rest), x.dtype)
    for b in np.ndindex(indices.shape[:-1]):
        sel = [slice(0, s) for s in sizes]
        for i, a in enumerate(axes):
            sel[a] = min(max(_wrapped(int(indices[b][i]), x.shape[a]), 0), x.shape[a] - 1)
        out[b] = x[tuple(sel)]
    return out


def np_scatter(target, indices, updates, axes, add):
    out = target.copy()
    for b in np.ndindex(indices.shape[:-1]):
        sel = [slice(None)] * target.ndim
        for i, a in enumerate(axes):
            sel[a] = _wrapped(int(indices[b][i]), target.shape[a])
        if all(0 <= sel[a] < target.shape[a] for a in axes):
            out[tuple(sel)] = out[tuple(sel)] + updates[b] if add else updates[b]
    return out


X = np.arange(3 * 4 * 5, dtype=np.float32).reshape(3, 4, 5)


# --- slice ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "starts, lengths, strides",
    [
        ([0, 1, 2], [3, 2, 3], [1, 1, 1]),
        ([-4, 3, 9], [2, 2, 3], [1, 1, 2]),
        ([1, 0, 0], [2, 4, 5], [2, 3, 2]),
        ([0, 0, 0], [0, 4, 5], [1, 1, 1]),
    ],
)
def test_static_slice(starts, lengths, strides):
    got = run_op("slice", X, starts=starts, lengths=lengths, strides=strides)
    assert_close(got, np_slice(X, starts, lengths, strides), dtype=mx.float32)


@pytest.mark.parametrize("start", [-7, 0, 1, 2, 50])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_dynamic_slice_clamps(start, dtype):
    if dtype == np.uint8 and start < 0:
        start = 255
    got = run_op("slice", X, dtype(start), starts=[0, 1, 0], lengths=[3, 2, 3],
                 strides=[1, 1, 2], dynamic_axes=[2])
    assert_close(got, np_slice(X, [0, 1, start], [3, 2, 3], [1, 1, 2]))


def test_dynamic_slice_several_axes_eager_and_no_retrace():
    prog = one_op_program("slice", X, np.int32(0), np.int32(0), lengths=[2, 4, 2],
                          strides=[1, 2, 1], dynamic_axes=[2, 0])
    exe = mp.compile(prog)
    eager = mp.compile(prog, eager=True)
    for s2, s0 in [(-3, 5), (1, 1), (4, -1)]:
        expected = np_slice(X, [s0, 0, s2], [2, 4, 2], [1, 2, 1])
        args = (mx.array(X), mx.array(s2), mx.array(s0))
        assert_close(exe(*args)[0], expected)
        assert_close(eager(*args)[0], expected)
    assert exe.stats.traces == 1


# --- put_slice ------------------------------------------------------------------------


def np_put_slice(x, update, starts):
    out = x.copy()
    out[tuple(
        slice(_fit(s, d, u), _fit(s, d, u) + u) for s, d, u in zip(starts, x.shape, update.shape)
    )] = update
    return out


UPDATE = -np.arange(2 * 2 * 3, dtype=np.float32).reshape(2, 2, 3)


@pytest.mark.parametrize("starts", [[0, 0, 0], [1, 2, 2], [-3, 9, 1], [5, -1, 4]])
def test_static_put_slice(starts):
    got = run_op("put_slice", X, UPDATE, starts=starts)
    assert_close(got, np_put_slice(X, UPDATE, starts), dtype=mx.float32)


@pytest.mark.parametrize("s0, s2", [(-2, 0), (1, 2), (3, 100), (0, -100)])
def test_dynamic_put_slice(s0, s2):
    got = run_op("put_slice", X, UPDATE, np.int64(s0), np.int16(s2), starts=[0, 2, 0],
                 dynamic_axes=[0, -1])
    assert_close(got, np_put_slice(X, UPDATE, [s0, 2, s2]))


def test_put_slice_converts_update_dtype_eagerly():
    update = np.full((1, 2, 2), 7, np.int32)
    got = run_op("put_slice", X, update, np.int32(1), dynamic_axes=[1], eager=True)
    assert_close(got, np_put_slice(X, update.astype(np.float32), [0, 1, 0]), dtype=mx.float32)


# --- gather, take, take_along_axis ---------------------------------------------------


@pytest.mark.parametrize(
    "axes, slice_sizes",
    [([0], None), ([2, 0], None), ([1], [2, 1, 3]), ([2, 1, 0], [1, 1, 1])],
)
def test_gather(axes, slice_sizes):
    indices = RNG.integers(-6, 8, size=(2, 3, len(axes))).astype(np.int32)
    sizes = slice_sizes or [1 if a in axes else d for a, d in enumerate(X.shape)]
    attrs = {"axes": axes} if slice_sizes is None else {"axes": axes, "slice_sizes": slice_sizes}
    got = run_op("gather", X, indices, **attrs)
    assert_close(got, np_gather(X, indices, axes, sizes), dtype=mx.float32)


def test_gather_unbatched_uint_indices_eager():
    indices = np.array([2, 7], np.uint16)
    got = run_op("gather", X, indices, axes=[0, 2], eager=True)
    assert_close(got, np_gather(X, indices, [0, 2], [1, 4, 1]))


def _clamped(indices, dim):
    return np.clip(np.where(indices < 0, indices + dim, indices), 0, dim - 1)


@pytest.mark.parametrize("axis", [0, 1, -1, None])
def test_take(axis):
    indices = np.array([[0, -1, 2], [7, -9, 1]], np.int32)
    dim = X.size if axis is None else X.shape[axis]
    got = run_op("take", X, indices, axis=axis)
    assert_close(got, np.take(X, _clamped(indices, dim), axis=axis), dtype=mx.float32)


@pytest.mark.parametrize("axis", [0, 2])
def test_take_along_axis(axis):
    shape = list(X.shape)
    shape[axis] = 4
    indices = RNG.integers(-6, 8, size=shape).astype(np.int64)
    got = run_op("take_along_axis", X, indices, axis=axis)
    expected = np.take_along_axis(X, _clamped(indices, X.shape[axis]), axis=axis)
    assert_close(got, expected)


# --- indexed_add, indexed_put --------------------------------------------------------


@pytest.mark.parametrize("axes", [[0], [2, 0], [1, 2, 0]])
def test_indexed_add_accumulates_and_drops_out_of_range(axes):
    indices = RNG.integers(-6, 8, size=(5, len(axes))).astype(np.int32)
    indices[1] = indices[0]  # a repeated index accumulates
    rest = tuple(d for a, d in enumerate(X.shape) if a not in axes)
    updates = RNG.standard_normal((5, *rest)).astype(np.float32)
    got = run_op("indexed_add", X, indices, updates, axes=axes)
    assert_close(got, np_scatter(X, indices, updates, axes, add=True), dtype=mx.float32)


def test_indexed_put_replaces_and_drops_out_of_range():
    indices = np.array([[[0, 1], [-1, 0]], [[2, -4], [3, 0]], [[0, 9], [-5, 2]]], np.int32)
    updates = RNG.standard_normal((3, 2, 5)).astype(np.float32)
    got = run_op("indexed_put", X, indices, updates, axes=[0, 1])
    assert_close(got, np_scatter(X, indices, updates, [0, 1], add=False), dtype=mx.float32)


def test_indexed_put_int_target_eager():
    target = np.zeros((4, 3), np.int32)
    indices = np.array([[3], [1]], np.uint8)
    updates = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    got = run_op("indexed_put", target, indices, updates, axes=[0], eager=True)
    assert_close(got, np_scatter(target, indices, updates, [0], add=False), dtype=mx.int32)


# --- top_k, argpartition -------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3, 7])
def test_top_k(k):
    x = np.stack([RNG.permutation(7) for _ in range(3)]).astype(np.float32) - 3
    values, indices = run_op("top_k", x, k=k)
    expected = np.argsort(-x, axis=-1)[:, :k]
    assert_close(indices, expected, dtype=mx.uint32)
    assert_close(values, np.take_along_axis(x, expected, -1), dtype=mx.float32)


@pytest.mark.parametrize(
    "x, expected",
    [
        (np.array([5, -128, 127, -1, 0], np.int8), [2, 0, 4, 3, 1]),
        (np.array([0, 255, 3, 128], np.uint8), [1, 3, 2, 0]),
        (np.array([1.0, np.nan, 3.0, -np.inf], np.float32), [2, 0, 3, 1]),
    ],
)
def test_top_k_orders_every_dtype(x, expected):
    values, indices = run_op("top_k", x, k=x.size, eager=True)
    assert_close(indices, np.array(expected))
    assert_close(values, x[expected], dtype=mx.array(x).dtype)


@pytest.mark.parametrize("kth, axis", [(0, 0), (2, 1), (-1, 1), (-4, 0)])
def test_argpartition(kth, axis):
    x = RNG.permutation(24).reshape(4, 6).astype(np.float32)
    result = run_op("argpartition", x, kth=kth, axis=axis)
    assert result.dtype == mx.uint32
    got = np.array(result)
    moved = np.moveaxis(x, axis, -1)
    order = np.moveaxis(got, axis, -1)
    k = kth % moved.shape[-1]
    for row, idx in zip(moved.reshape(-1, moved.shape[-1]), order.reshape(-1, moved.shape[-1])):
        assert sorted(idx) == list(range(row.size))
        part = row[idx]
        assert part[k] == np.sort(row)[k]
        assert (part[:k] <= part[k]).all() and (part[k + 1:] >= part[k]).all()


# --- uint64 and int64 indices ---------------------------------------------------------

BIG = 2**63  # read as negative if converted to int64 before clamping


def _u64(*values: int) -> np.ndarray:
    return np.array(values, np.uint64)


@pytest.mark.parametrize("eager", [False, True])
def test_uint64_indices_are_never_negative(eager):
    x = np.arange(5, dtype=np.float32)
    ones = np.ones(3, np.float32)
    # Reads clamp to the last element.
    assert_close(run_op("take", x, _u64(BIG, 2**64 - 1, 1), eager=eager), [4, 4, 1])
    assert_close(run_op("take_along_axis", x, _u64(BIG, 3), axis=0, eager=eager), [4, 3])
    assert_close(run_op("gather", x, _u64(BIG, 2).reshape(2, 1), axes=[0], eager=eager), [4, 2])
    # Scatters drop out-of-range updates.
    indices = _u64(2**64 - 1, BIG, 0).reshape(3, 1)
    assert_close(run_op("indexed_add", x, indices, ones, axes=[0], eager=eager), [1, 1, 2, 3, 4])
    assert_close(run_op("indexed_put", x, indices, 9 * ones, axes=[0], eager=eager),
                 [9, 1, 2, 3, 4])
    # Dynamic starts clamp to the end.
    start = np.uint64(BIG + 5)
    assert_close(run_op("slice", x, start, lengths=[2], dynamic_axes=[0], eager=eager), [3, 4])
    assert_close(run_op("put_slice", x, np.full(2, 9, np.float32), start, dynamic_axes=[0],
                        eager=eager), [0, 1, 2, 9, 9])


@pytest.mark.parametrize("eager", [False, True])
def test_extreme_signed_indices_clamp_or_drop(eager):
    x = np.arange(5, dtype=np.float32)
    extremes = np.array([-BIG, BIG - 1, -1], np.int64)
    assert_close(run_op("take", x, extremes, eager=eager), [0, 4, 4])
    assert_close(run_op("indexed_add", x, extremes.reshape(3, 1), np.ones(3, np.float32),
                        axes=[0], eager=eager), [0, 1, 2, 3, 5])
    assert_close(run_op("take", x, np.array([-128, 127, -6, -5], np.int8), eager=eager),
                 [0, 4, 0, 0])


# --- empty axes ------------------------------------------------------------------------


EMPTY_AXIS = mx.zeros((2, 0))


@pytest.mark.parametrize("op, indices, attrs, shape", [
    ("take", np.zeros(0, np.int32), {"axis": 1}, (2, 0)),
    ("take_along_axis", np.zeros((2, 0), np.int32), {"axis": 1}, (2, 0)),
    ("gather", np.zeros((0, 1), np.int32), {"axes": [1]}, (0, 2)),
    ("take", np.zeros(3, np.int32), {"axis": 0}, (3, 0)),
])
def test_no_indices_into_an_empty_axis_read_nothing(op, indices, attrs, shape):
    assert run_op(op, EMPTY_AXIS, indices, **attrs).shape == shape


# --- validation ----------------------------------------------------------------------


I32 = np.int32(0)
IDX = np.zeros((2, 2), np.int32)

INVALID = [
    ("slice", [X], {"lengths": [2, 2]}, "lengths needs one entry per axis"),
    ("slice", [X], {"lengths": [4, 2, 2]}, "lengths[0] = 4 exceeds dimension 3"),
    ("slice", [X], {"lengths": [-1, 2, 2]}, "greater than or equal to 0"),
    ("slice", [X], {"lengths": [1, 2, 2], "strides": [1, 0, 1]}, "greater than or equal to 1"),
    ("slice", [X], {"lengths": [1, 2, 2], "starts": [0, 0]}, "starts needs one entry"),
    ("slice", [X, I32], {"lengths": [1, 2, 2], "dynamic_axes": [3]}, "out of range"),
    ("slice", [X], {"lengths": [1, 2, 2], "dynamic_axes": [0]}, "needs 1 start operand"),
    ("slice", [X, np.zeros(1, np.int32)], {"lengths": [1, 2, 2], "dynamic_axes": [0]},
     "must be a scalar"),
    ("slice", [X, np.float32(1)], {"lengths": [1, 2, 2], "dynamic_axes": [0]},
     "integer dtype; found float32"),
    ("slice", [X, I32], {"lengths": [1, 2, 2], "starts": [1, 0, 0], "dynamic_axes": [0]},
     "starts[0] must be 0"),
    ("put_slice", [X, np.zeros((4, 1, 1), np.float32)], {}, "fit inside it"),
    ("put_slice", [X, np.zeros((1, 1), np.float32)], {}, "must have the rank of the input"),
    ("put_slice", [X, UPDATE, I32, I32], {"dynamic_axes": [0]}, "needs 1 start operand"),
    ("gather", [X, IDX], {"axes": [0]}, "must have shape [..., 1]"),
    ("gather", [X, IDX.astype(np.float32)], {"axes": [0, 1]}, "integer dtype"),
    ("gather", [X, IDX], {"axes": [0, 5]}, "out of range"),
    ("gather", [X, IDX], {"axes": [], "slice_sizes": [1, 1, 1]}, "at least one axis"),
    ("gather", [X, IDX], {"axes": [0, 1], "slice_sizes": [1, 2, 1]}, "slice_sizes[1] must be 1"),
    ("gather", [X, IDX], {"axes": [0, 1], "slice_sizes": [1, 1, 6]}, "exceeds dimension 5"),
    ("take", [X, np.zeros(2, np.float32)], {"axis": 0}, "integer dtype"),
    ("take", [X, IDX], {"axis": -4}, "out of range"),
    ("take_along_axis", [X, np.zeros((3, 4, 2), bool)], {"axis": 2}, "integer dtype"),
    ("take_along_axis", [X, np.zeros((3, 4), np.int32)], {"axis": 2},
     "does not match array of dimension 3"),
    # Indices into an empty axis: take and gather rejected them, take_along_axis
    # returned zeros.
    ("take_along_axis", [EMPTY_AXIS, np.zeros((2, 1), np.int32)], {"axis": 1},
     "cannot read at 2 indices from axis 1 of operand 0 float32[2, 0], which is empty"),
    ("take", [EMPTY_AXIS, np.zeros(3, np.int32)], {"axis": 1},
     "cannot read at 3 indices from axis 1 of operand 0 float32[2, 0], which is empty"),
    ("take", [EMPTY_AXIS, np.zeros(1, np.int32)], {},
     "from axis 1 of operand 0 float32[2, 0], which is empty"),
    ("gather", [EMPTY_AXIS, np.zeros((3, 1), np.int32)], {"axes": [1]},
     "cannot read at 3 index vectors from axis 1"),
    ("indexed_add", [X, IDX, np.zeros((2, 5), np.float32)], {"axes": [0, 2]},
     "updates (operand 2) must have shape [2, 4]"),
    ("indexed_put", [X, IDX, np.zeros((2, 5), np.float32)], {"axes": [0]},
     "must have shape [..., 1]"),
    ("top_k", [X], {"k": 6}, "k = 6 must be at most the last dimension; found 5"),
    ("top_k", [X], {"k": 0}, "greater than or equal to 1"),
    ("top_k", [np.float32(1)], {"k": 1}, "a scalar"),
    ("argpartition", [X], {"kth": 5}, "kth = 5 is out of range"),
    ("argpartition", [np.float32(1)], {"kth": 0},
     "attribute 'axis': axis -1 is out of range for an operand of rank 0"),
    ("argpartition", [X], {"kth": 0, "axes": [0]}, "unknown attribute"),
]


@pytest.mark.parametrize("op, operands, attrs, message", INVALID)
def test_invalid(op, operands, attrs, message):
    assert_invalid(message, op, *operands, **attrs)
