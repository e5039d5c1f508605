"""ONNX comparison and logic converters against the reference evaluator."""

import numpy as np
import pytest

from onnx_cases import check_node


RNG = np.random.default_rng(0)


@pytest.mark.parametrize("op", ["Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8])
def test_comparisons_broadcast(op, dtype):
    a = RNG.integers(0, 4, (2, 3, 4)).astype(dtype)
    b = RNG.integers(0, 4, (3, 1)).astype(dtype)
    out, = check_node(op, {"a": a, "b": b})
    assert out.dtype == np.bool_


def test_comparisons_with_nan():
    a = np.array([np.nan, 1.0, np.nan], np.float32)
    b = np.array([np.nan, np.nan, 2.0], np.float32)
    for op in ["Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual"]:
        check_node(op, {"a": a, "b": b})


def test_equal_bool():
    check_node("Equal", {"a": np.array([True, False, True]), "b": np.array([True, True, False])})


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic_broadcast(op):
    a = RNG.integers(0, 2, (2, 3, 4)).astype(bool)
    b = RNG.integers(0, 2, (4,)).astype(bool)
    check_node(op, {"a": a, "b": b})


def test_not():
    check_node("Not", {"x": RNG.integers(0, 2, (3, 4)).astype(bool)})


def test_empty():
    check_node("Less", {"a": np.zeros((0, 2), np.float32), "b": np.zeros((2,), np.float32)})
    check_node("And", {"a": np.zeros((2, 0), bool), "b": np.zeros((1, 0), bool)})
