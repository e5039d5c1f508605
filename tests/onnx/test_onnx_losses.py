"""ONNX NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against the reference evaluator."""

import numpy as np
import pytest

from onnx_cases import check_model, node_model


RNG = np.random.default_rng(0)
SHAPES = [(3, 5), (2, 4, 3), (2, 3, 2, 4)]


def _case(shape, label_dtype, ignore_index, weighted):
    x = RNG.uniform(-2, 2, shape).astype(np.float32)
    target = RNG.integers(0, shape[1], (shape[0],) + shape[2:]).astype(label_dtype)
    if ignore_index is not None:
        target.reshape(-1)[::3] = ignore_index
    inputs = {"x": x, "target": target}
    if weighted:
        inputs["weight"] = RNG.uniform(0.2, 1.5, shape[1]).astype(np.float32)
    attrs = {} if ignore_index is None else {"ignore_index": ignore_index}
    return inputs, attrs


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [None, 1, -1, 7])
def test_nll_loss(shape, reduction, weighted, ignore_index):
    if ignore_index == -1 and not weighted and reduction == "mean":
        pytest.skip("the reference averages over the ignored targets too here (its quirk)")
    inputs, attrs = _case(shape, np.int64, ignore_index, weighted)
    model = node_model("NegativeLogLikelihoodLoss", inputs, ("loss",), opset=22,
                       reduction=reduction, **attrs)
    check_model(model, inputs, 1e-5, 1e-5)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [None, 2, -5])
@pytest.mark.parametrize("label_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("log_prob", [False, True])
def test_softmax_cross_entropy(shape, reduction, weighted, ignore_index, label_dtype, log_prob):
    inputs, attrs = _case(shape, label_dtype, ignore_index, weighted)
    outputs = ("loss", "log_prob") if log_prob else ("loss",)
    model = node_model("SoftmaxCrossEntropyLoss", inputs, outputs, opset=13,
                       reduction=reduction, **attrs)
    check_model(model, inputs, 1e-5, 1e-5)


def test_softmax_cross_entropy_default_mean():
    inputs, _ = _case((4, 6), np.int64, None, False)
    check_model(node_model("SoftmaxCrossEntropyLoss", inputs, ("loss",), opset=13),
                inputs, 1e-5, 1e-5)
