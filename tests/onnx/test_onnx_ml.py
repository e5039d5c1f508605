"""The ai.onnx.ml converters (Binarizer, ArrayFeatureExtractor, TreeEnsemble)
against the reference evaluator."""

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx_cases import check_model, value_info

from mlxprog.onnx import OnnxImportError, import_model


def _ml_model(op_type, inputs, **attrs):
    """A one-node ai.onnx.ml model without a default-domain opset (as ONNX's
    own ai.onnx.ml cases are)."""
    node = helper.make_node(op_type, list(inputs), ["y"], domain="ai.onnx.ml", **attrs)
    graph = helper.make_graph([node], "case", [value_info(n, a) for n, a in inputs.items()],
                              [helper.make_value_info("y", onnx.TypeProto())])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 5)])


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_binarizer(dtype):
    x = np.array([[-1, 0, 1], [2, 3, -4]], dtype)
    check_model(_ml_model("Binarizer", {"x": x}, threshold=0.5), {"x": x})


@pytest.mark.parametrize("shape", [(5,), (2, 5), (2, 3, 5)])
def test_array_feature_extractor(shape):
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    inputs = {"x": x, "i": np.array([[4, 0], [2, 2]], np.int64)}
    check_model(_ml_model("ArrayFeatureExtractor", inputs), inputs)


def test_array_feature_extractor_scalar_input():
    inputs = {"x": np.array(1.0, np.float32), "i": np.array([0], np.int64)}
    with pytest.raises(OnnxImportError, match="rank 1 or more"):
        import_model(_ml_model("ArrayFeatureExtractor", inputs))


def _trees(aggregate, post_transform=0):
    """Two trees over 2 features: x0 <= 1 ? leaf 0 : (x1 > 0.5 ? leaf 1 : leaf 2), and
    x1 < 0 (NaN counts as true) ? leaf 3 : leaf 4."""
    def tensor(name, values, dtype):
        return onnx.numpy_helper.from_array(np.array(values, dtype), name)

    return dict(
        aggregate_function=aggregate, post_transform=post_transform, n_targets=2,
        nodes_featureids=[0, 1, 1], nodes_modes=tensor("modes", [0, 3, 1], np.uint8),
        nodes_splits=tensor("splits", [1.0, 0.5, 0.0], np.float32),
        nodes_truenodeids=[0, 1, 3], nodes_trueleafs=[1, 1, 1],
        nodes_falsenodeids=[1, 2, 4], nodes_falseleafs=[0, 1, 1],
        nodes_missing_value_tracks_true=[0, 0, 1], tree_roots=[0, 2],
        leaf_targetids=[0, 1, 0, 1, 1],
        leaf_weights=tensor("weights", [1.0, 2.0, 3.0, 4.0, 5.0], np.float32))


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble_aggregates(aggregate):
    x = np.array([[0.5, 1.0], [2.0, 1.0], [2.0, -1.0], [3.0, np.nan], [1.0, 0.2]], np.float32)
    check_model(_ml_model("TreeEnsemble", {"x": x}, **_trees(aggregate)), {"x": x})


def test_tree_ensemble_bad_post_transform():
    x = np.zeros((1, 2), np.float32)
    with pytest.raises(OnnxImportError, match="post_transform=2"):
        import_model(_ml_model("TreeEnsemble", {"x": x}, **_trees(1, post_transform=2)))
