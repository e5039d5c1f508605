"""Creation ops (iota, eye, full, arange) against numpy references, run through
compiled programs without inputs (and a sample eagerly)."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlxprog as mp
from helpers import assert_close, assert_invalid, one_op_program, run_op

FAST = settings(max_examples=25, deadline=None)


def np_iota(shape, axis):
    if axis is None:
        return np.arange(math.prod(shape)).reshape(shape)
    along = [1] * len(shape)
    along[axis] = shape[axis]
    return np.broadcast_to(np.arange(shape[axis]).reshape(along), shape)


# --- iota ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, axis, dtype",
    [
        ([2, 3], None, "int32"),
        ([2, 3], 0, "int32"),
        ([2, 3, 4], 2, "float32"),
        ([2, 3, 4], -2, "int32"),
        ([5], 0, "uint8"),
        ([], None, "int32"),
        ([0, 3], 1, "int32"),
        ([3, 2], None, "float16"),
    ],
)
def test_iota(shape, axis, dtype):
    got = run_op("iota", shape=shape, axis=axis, dtype=dtype)
    expected = np_iota(shape, None if axis is None else axis % len(shape))
    assert_close(got, expected, dtype=mp.arrays.to_mlx(dtype))


@FAST
@given(st.lists(st.integers(0, 4), max_size=4), st.data())
def test_iota_shapes(shape, data):
    axis = data.draw(st.none() | st.integers(0, len(shape) - 1)) if shape else None
    got = run_op("iota", shape=shape, axis=axis)
    assert_close(got, np_iota(shape, axis), dtype=mx.int32)


def test_iota_invalid():
    assert_invalid("axis 2 is out of range for a result of rank 2", "iota", shape=[2, 3], axis=2)
    assert_invalid("attribute 'shape.1'", "iota", shape=[2, -3])
    assert_invalid("unknown dtype 'int3'", "iota", shape=[2], dtype="int3")


# --- eye --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, m, k, dtype",
    [(3, None, 0, "float32"), (2, 4, 1, "int32"), (4, 2, -1, "float32"), (3, 3, 5, "bool"),
     (0, None, 0, "float32")],
)
def test_eye(n, m, k, dtype):
    got = run_op("eye", n=n, m=m, k=k, dtype=dtype)
    assert_close(got, np.eye(n, m, k), dtype=mp.arrays.to_mlx(dtype))


def test_eye_defaults():
    assert_close(run_op("eye", n=2), np.eye(2), dtype=mx.float32)


def test_eye_invalid():
    assert_invalid("attribute 'n'", "eye", n=-1)
    assert_invalid("attribute 'n'", "eye", m=3)


# --- full -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, dtype, expected",
    [
        (1.5, "float32", 1.5),
        (3, "int8", 3),
        (-128, "int8", -128),
        (True, "bool", True),
        (0, "bool", False),
        ("nan", "float32", np.nan),
        ("-inf", "float16", -np.inf),
        ("inf", "bfloat16", np.inf),
        (2.0, "int32", 2),
        (2**64 - 1, "uint64", 2**64 - 1),
        (0.25, "complex64", 0.25),
    ],
)
def test_full(value, dtype, expected):
    got = run_op("full", shape=[2, 3], dtype=dtype, value=value)
    reference = np.full((2, 3), expected, np.uint64 if dtype == "uint64" else None)
    assert_close(got, reference, dtype=mp.arrays.to_mlx(dtype))


def test_full_scalar_shape():
    assert_close(run_op("full", shape=[], dtype="float32", value=7), np.float32(7),
                 dtype=mx.float32)


@pytest.mark.parametrize(
    "value, dtype, message",
    [
        (300, "int8", "300 is out of range for int8 [-128, 127]"),
        (-1, "uint32", "-1 is out of range for uint32"),
        (1.5, "int32", "1.5 is not a whole number, as dtype int32 needs"),
        ("nan", "int32", "nan is not a whole number"),
        (2, "bool", "2 is not a bool (or 0 or 1)"),
        (1e39, "float32", "out of range for float32"),
        (7e4, "float16", "out of range for float16"),
        ("1", "float32", 'expected a number, a bool, or one of "nan", "inf", "-inf"'),
        (None, "float32", "found None"),
    ],
)
def test_full_invalid(value, dtype, message):
    assert_invalid(message, "full", shape=[2], dtype=dtype, value=value)


# --- arange ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attrs, expected, dtype",
    [
        ({"stop": 5}, np.arange(5), mx.int32),
        ({"start": 2, "stop": 11, "step": 3}, np.arange(2, 11, 3), mx.int32),
        ({"start": 5, "stop": -1, "step": -2}, np.arange(5, -1, -2), mx.int32),
        ({"start": 0.5, "stop": 2, "step": 0.25}, np.arange(0.5, 2, 0.25), mx.float32),
        ({"start": 3, "stop": 3}, np.arange(3, 3), mx.int32),
        ({"stop": 4, "dtype": "float16"}, np.arange(4), mx.float16),
        ({"start": -2, "stop": 2, "dtype": "int64"}, np.arange(-2, 2), mx.int64),
    ],
)
def test_arange(attrs, expected, dtype):
    assert_close(run_op("arange", **attrs), expected, dtype=dtype)


@pytest.mark.parametrize(
    "attrs, message",
    [
        ({"start": 0, "stop": 3, "step": 0}, "step must be nonzero"),
        ({"stop": 3, "step": 0.5, "dtype": "int32"}, "step 0.5 is not a whole number"),
        ({"stop": 3, "dtype": "bool"}, "bool not supported for arange"),
        ({"stop": float("inf")}, "expected a finite number"),
        ({"stop": True}, "expected a number"),
        ({"start": 1}, "attribute 'stop'"),
    ],
)
def test_arange_invalid(attrs, message):
    assert_invalid(message, "arange", **attrs)


# --- normalisation, compiled program without inputs, eager -------------------------------


def test_iota_axis_is_normalised():
    step = mp.validate(one_op_program("iota", shape=[2, 3], axis=-1)).block.steps[0]
    assert step.attrs.axis == 1


def test_creation_ops_compose_in_one_compiled_program():
    b = mp.ProgramBuilder("created")
    x = b.input("x", (3, 3), "float32")
    y = b.add(b.multiply(x, b.eye(n=3)), b.full(shape=[3, 3], dtype="float32", value=1))
    prog = b.build([y])
    exe = mp.compile(prog)
    got = exe(mx.full((3, 3), 2.0))[0]
    assert_close(got, 2 * np.eye(3) + 1, dtype=mx.float32)
    exe(mx.ones((3, 3)))
    assert exe.stats.traces == 1


@pytest.mark.parametrize(
    "op, attrs",
    [
        ("iota", {"shape": [2, 3], "axis": 0, "dtype": "float32"}),
        ("eye", {"n": 3, "m": 4, "k": -1}),
        ("full", {"shape": [2], "dtype": "float32", "value": "nan"}),
        ("arange", {"start": 1, "stop": 2, "step": 0.125}),
    ],
)
def test_eager_agrees_with_compiled(op, attrs):
    compiled = run_op(op, **attrs)
    eager = run_op(op, eager=True, **attrs)
    np.testing.assert_array_equal(np.array(eager), np.array(compiled))
