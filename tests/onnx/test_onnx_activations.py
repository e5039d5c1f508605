"""ONNX activation converters against the reference evaluator."""

import numpy as np
import pytest

import onnx_cases
from onnx_cases import check_model, check_node, node_model


RNG = np.random.default_rng(0)


def floats(*shape, dtype=np.float32, lo=-4.0, hi=4.0):
    return RNG.uniform(lo, hi, shape).astype(dtype)


CASES = [
    ("Relu", {}), ("LeakyRelu", {}), ("LeakyRelu", {"alpha": 0.3}), ("Elu", {}),
    ("Elu", {"alpha": 0.5}), ("Selu", {}), ("Selu", {"alpha": 1.5, "gamma": 2.0}),
    ("Celu", {}), ("Celu", {"alpha": 2.0}), ("Sigmoid", {}), ("HardSigmoid", {}),
    ("HardSigmoid", {"alpha": 0.5, "beta": 0.6}), ("HardSwish", {}), ("Tanh", {}),
    ("Softplus", {}), ("Softsign", {}), ("ThresholdedRelu", {}),
    ("ThresholdedRelu", {"alpha": 2.0}), ("Gelu", {}), ("Gelu", {"approximate": "tanh"}),
    ("Mish", {}), ("Shrink", {}), ("Shrink", {"bias": 1.5, "lambd": 1.0}),
    ("Softmax", {}), ("Softmax", {"axis": 0}), ("Softmax", {"axis": 1}),
    ("LogSoftmax", {}), ("LogSoftmax", {"axis": -3}), ("LogSoftmax", {"axis": 1}),
    ("Hardmax", {}), ("Hardmax", {"axis": 0}), ("Hardmax", {"axis": 1}),
]


@pytest.mark.parametrize("op,attrs", CASES, ids=lambda c: str(c))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_activation(op, attrs, dtype):
    check_node(op, {"x": floats(2, 3, 4, dtype=dtype)}, rtol=1e-5, atol=1e-6, **attrs)


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Tanh", "Softmax", "Gelu", "HardSwish"])
def test_float16(op):
    check_node(op, {"x": floats(3, 4, dtype=np.float16)}, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8])
def test_relu_integer(dtype):
    check_node("Relu", {"x": RNG.integers(-5, 5, (3, 4)).astype(dtype)})


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_prelu_broadcasts_slope(dtype):
    x = (floats(2, 3, 4) * 3).astype(dtype)
    slope = np.array([[1], [2], [3]], dtype) if dtype != np.float32 else \
        np.array([[0.1], [0.2], [0.3]], dtype)
    check_node("PRelu", {"x": x, "slope": slope})


@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 3, 4, 3)])
def test_prelu_legacy_per_channel_slope(shape):
    """Opset 6's PRelu takes a slope of C values per channel (axis 1): the
    importer makes it [C, 1, ..., 1] before converting the model, also where
    the last axis has C elements too (NumPy broadcasting would pair them)."""
    from onnx_cases import run_mlxprog

    x = floats(*shape)
    slope = np.array([0.1, 0.2, 0.3], np.float32)
    model = node_model("PRelu", {"x": x}, initializers={"slope": slope}, opset=6)
    (y,) = run_mlxprog(model, {"x": x})
    per_channel = slope.reshape(3, *[1] * (len(shape) - 2))
    np.testing.assert_allclose(y, np.where(x < 0, x * per_channel, x), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_shrink_integer(dtype):
    x = np.arange(-5, 6).astype(dtype)
    check_node("Shrink", {"x": x}, bias=1.5, lambd=1.5)
    check_node("Shrink", {"x": x})


def test_softplus_large_values():
    check_node("Softplus", {"x": np.array([-80.0, -10.0, 0.0, 10.0, 50.0], np.float32)})


def test_hardmax_ties_take_the_first():
    x = np.array([[1, 3, 3, 0], [2, 2, 2, 2]], np.float32)
    out, = check_node("Hardmax", {"x": x})
    np.testing.assert_array_equal(out, [[0, 1, 0, 0], [1, 0, 0, 0]])


def test_softmax_extremes():
    x = np.array([[1000.0, 0.0, -1000.0], [-np.inf, 0.0, 1.0]], np.float32)
    check_node("Softmax", {"x": x})
    # The reference computes log(softmax(x)), which underflows to -inf; the
    # converter subtracts the log-sum-exp, exact here.
    model = node_model("LogSoftmax", {"x": np.array([[1000.0, 0.0, -10.0]], np.float32)})
    out, = onnx_cases.run_mlxprog(model, {"x": np.array([[1000.0, 0.0, -10.0]], np.float32)})
    np.testing.assert_allclose(out, [[0.0, -1000.0, -1010.0]])
    assert out.dtype == np.float32


def test_swish_opset_24():
    try:
        model = node_model("Swish", {"x": floats(2, 5)}, opset=24, alpha=0.7)
        from onnx.reference import ReferenceEvaluator
        ReferenceEvaluator(model)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"the installed onnx cannot evaluate Swish: {e}")
    check_model(model, {"x": floats(2, 5)})


def test_empty():
    check_node("Relu", {"x": np.zeros((0, 3), np.float32)})
    check_node("Softmax", {"x": np.zeros((0, 3), np.float32)})
    check_node("Hardmax", {"x": np.zeros((0, 3), np.float32)})


@pytest.mark.parametrize("op,axis", [("Hardmax", 0), ("Hardmax", 1), ("Softmax", 0),
                                     ("LogSoftmax", 0)])
def test_symbolic_batch(op, axis):
    import onnx
    from onnx import helper

    node = helper.make_node(op, ["x"], ["y"], axis=axis)
    spec = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3])
    graph = helper.make_graph([node], "case", [spec],
                              [helper.make_value_info("y", onnx.TypeProto())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", onnx_cases.OPSET)])
    for n in (2, 5):
        check_model(model, {"x": floats(n, 3)})


def test_swiglu_alpha_and_bad_shapes():
    from mlxprog.onnx import OnnxImportError, import_model

    a, g = floats(2, 6), floats(2, 6)
    check_model(node_model("SwiGLU", {"a": a, "g": g}, opset=28, alpha=1.7), {"a": a, "g": g})
    with pytest.raises(OnnxImportError, match="one shape and type"):
        import_model(node_model("SwiGLU", {"a": a, "g": floats(1, 6)}, opset=28))
