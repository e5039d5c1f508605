"""QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear against ONNX's
reference evaluator."""

import numpy as np
import pytest

from onnx_cases import check_model, node_model

rng = np.random.default_rng(5)


def check(op, inputs, initializers=None, outputs=("y",), **attrs):
    model = node_model(op, inputs, outputs, initializers, **attrs)
    return check_model(model, inputs, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16])
def test_quantize_per_tensor(dtype):
    x = (rng.standard_normal((3, 4)) * 300).astype(np.float32)
    x[0, :4] = [0.5, 1.5, 2.5, -2.5]  # halves round to even
    zp = np.array(3 if dtype in (np.uint8, np.uint16) else -2, dtype)
    check("QuantizeLinear", {"x": x}, {"s": np.float32(0.5), "zp": zp})


def test_quantize_default_uint8_saturates():
    x = np.array([-10.0, 0.4, 300.0, 1000.0], np.float32)
    check("QuantizeLinear", {"x": x}, {"s": np.array(1.0, np.float32)})


def test_quantize_per_axis_and_output_dtype():
    x = rng.standard_normal((2, 3, 4)).astype(np.float32) * 10
    check("QuantizeLinear", {"x": x}, {"s": np.array([0.1, 0.5, 2.0], np.float32)},
          axis=1, output_dtype=3)  # int8


def test_quantize_blocked():
    x = rng.standard_normal((3, 5)).astype(np.float32) * 10
    s = rng.uniform(0.1, 1.0, (3, 3)).astype(np.float32)
    zp = rng.integers(-5, 5, (3, 3)).astype(np.int8)
    check("QuantizeLinear", {"x": x}, {"s": s, "zp": zp}, axis=1, block_size=2)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32])
def test_dequantize_per_tensor(dtype):
    info = np.iinfo(dtype)
    x = rng.integers(max(info.min, -1000), min(info.max, 1000), (3, 4)).astype(dtype)
    check("DequantizeLinear", {"x": x}, {"s": np.float32(0.25), "zp": np.array(7, dtype)})


def test_dequantize_per_axis_blocked_float16():
    x = rng.integers(0, 255, (4, 6)).astype(np.uint8)
    check("DequantizeLinear", {"x": x}, {"s": np.array([0.5, 1.0, 2.0, 4.0], np.float16)},
          axis=0)
    s = rng.uniform(0.1, 1.0, (2, 6)).astype(np.float32)
    zp = rng.integers(0, 20, (2, 6)).astype(np.uint8)
    check("DequantizeLinear", {"x": x}, {"s": s, "zp": zp}, axis=0, block_size=3)


def test_dynamic_quantize():
    x = rng.standard_normal((3, 4)).astype(np.float32) * 3
    model = node_model("DynamicQuantizeLinear", {"x": x}, ("y", "s", "zp"))
    check_model(model, {"x": x}, rtol=1e-6, atol=0)
