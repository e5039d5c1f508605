"""Indexing converters against ONNX's reference evaluator."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx_cases import (
    OPSET, check_model, check_node, node_model, normal_f32, run_mlxprog,
)


rng = np.random.default_rng(2)

f32 = normal_f32(rng)


def i64(values):
    return np.array(values, np.int64)


# -- Gather ----------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather(axis):
    check_node("Gather", {"x": f32(3, 4, 5), "i": i64([[0, -1], [2, 1]])}, axis=axis)


def test_gather_scalar_index():
    check_node("Gather", {"x": f32(3, 4), "i": np.array(-2, np.int64)}, axis=1)


def test_gather_int32_indices_int_data():
    check_node("Gather", {"x": np.arange(12, dtype=np.int64).reshape(3, 4),
                          "i": np.array([2, 0, 0], np.int32)})


def test_gather_constant_data_runtime_indices():
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=1)
    graph = helper.make_graph(
        [node], "case", [helper.make_tensor_value_info("i", onnx.TensorProto.INT64, [2])],
        [helper.make_value_info("y", onnx.TypeProto())],
        [numpy_helper.from_array(f32(2, 3), "x")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    check_model(model, {"i": i64([1, 0])})


# -- GatherElements ------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    # (The reference evaluator compares shapes with a negative axis as given,
    # so axis=-1 gets indices of the data's shape.)
    indices = {0: i64([[0, 1, -1, 2], [2, 0, 1, 1]]), 1: i64([[0, 3], [-1, 1], [2, 2]]),
               -1: i64([[0, 3, 1, 1], [-1, 1, 0, 0], [2, 2, 3, -4]])}[axis]
    check_node("GatherElements", {"x": f32(3, 4), "i": indices}, axis=axis)


def test_gather_elements_smaller_indices():
    # Indices smaller than the data on the other axis (ONNX allows it; the
    # reference evaluator does not): against numpy.
    x, indices = f32(4, 5), i64([[4, 0], [1, -1]])
    (got,) = run_mlxprog(node_model("GatherElements", {"x": x, "i": indices}, axis=1),
                         {"x": x, "i": indices})
    np.testing.assert_array_equal(got, np.take_along_axis(x[:2], indices % 5, axis=1))


# -- GatherND ----------------------------------------------------------------------------------


@pytest.mark.parametrize("data,indices,batch_dims", [
    ((2, 2), [[0, 0], [1, 1]], 0),
    ((2, 2), [[1], [0]], 0),
    ((2, 2, 2), [[0, 1], [1, 0]], 0),
    ((2, 2, 2), [[[0, 1]], [[1, 0]]], 0),
    ((2, 2, 2), [[1], [0]], 1),
    ((2, 3, 4), [[[1, 2], [0, -1]], [[2, 3], [0, 0]]], 1),
    ((2, 3, 4, 5), [[[1], [0]], [[2], [1]]], 1),
    ((3, 3, 4, 5), [[[1, 2]], [[0, 0]], [[2, 1]]], 0),
])
def test_gather_nd(data, indices, batch_dims):
    check_node("GatherND", {"x": f32(*data), "i": i64(indices)}, batch_dims=batch_dims)


def test_gather_nd_two_batch_dims():
    check_node("GatherND", {"x": f32(2, 3, 4), "i": i64([[[1], [0], [3]], [[2], [2], [-1]]])},
               batch_dims=2)


# -- ScatterElements ---------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements(axis):
    indices = i64([[1, 0, 2], [0, 2, 1]]) if axis == 0 else i64([[1, 0, 2], [0, 2, 1]])
    check_node("ScatterElements", {"x": f32(3, 3), "i": indices, "u": f32(2, 3)}, axis=axis)


def test_scatter_elements_negative_and_smaller():
    check_node("ScatterElements", {"x": f32(3, 5), "i": i64([[-1, 1]]), "u": f32(1, 2)},
               axis=1)


def test_scatter_elements_add_repeated():
    check_node("ScatterElements", {"x": f32(1, 5), "i": i64([[1, 3, 1, 1]]), "u": f32(1, 4)},
               axis=1, reduction="add")


def test_scatter_elements_int():
    check_node("ScatterElements", {"x": np.zeros((2, 3), np.int32), "i": i64([[2], [0]]),
                                   "u": np.array([[5], [7]], np.int32)}, axis=1)


@pytest.mark.parametrize("reduction", ["mul", "max", "min", "add"])
@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_elements_reductions(reduction, axis):
    indices = i64([[1, 0, 1, 2], [1, -3, 2, 2]]) if axis == 0 else i64([[1, 1], [0, -1], [2, 2]])
    check_node("ScatterElements", {"x": f32(3, 4), "i": indices, "u": f32(*indices.shape)},
               axis=axis, reduction=reduction)


@pytest.mark.parametrize("reduction", ["mul", "max", "min"])
def test_scatter_elements_reductions_int_3d(reduction):
    x = rng.integers(-5, 5, (2, 3, 4)).astype(np.int64)
    indices = i64([[[0, 2], [1, 1], [3, 3]], [[2, 2], [0, 1], [-1, 0]]])
    u = rng.integers(-5, 5, indices.shape).astype(np.int64)
    check_node("ScatterElements", {"x": x, "i": indices, "u": u}, axis=2, reduction=reduction)


@pytest.mark.parametrize("reduction", ["max", "min"])
def test_scatter_elements_reductions_smaller_indices(reduction):
    # Indices smaller than the data on a non-scatter axis.
    check_node("ScatterElements", {"x": f32(4, 3), "i": i64([[2, 2], [0, 2]]),
                                   "u": f32(2, 2)}, axis=0, reduction=reduction)


# -- ScatterND --------------------------------------------------------------------------------


@pytest.mark.parametrize("data,indices,updates", [
    ((8,), [[4], [3], [1], [-1]], (4,)),
    ((4, 4, 4), [[0], [2]], (2, 4, 4)),
    ((3, 4), [[0, 1], [2, 3], [-1, 0]], (3,)),
    ((2, 3, 4), [[[0, 1]], [[1, 2]]], (2, 1, 4)),
])
def test_scatter_nd(data, indices, updates):
    check_node("ScatterND", {"x": f32(*data), "i": i64(indices), "u": f32(*updates)})


@pytest.mark.parametrize("reduction", ["mul", "max", "min"])
@pytest.mark.parametrize("data,indices,updates", [
    ((5,), [[1], [1], [-1]], (3,)),
    ((3, 4), [[0, 1], [0, 1], [2, 3]], (3,)),
    ((3, 2, 2), [[0], [2], [0]], (3, 2, 2)),
    ((2, 3, 4), [[[0, 1]], [[0, 1]]], (2, 1, 4)),
])
def test_scatter_nd_reductions(reduction, data, indices, updates):
    check_node("ScatterND", {"x": f32(*data), "i": i64(indices), "u": f32(*updates)},
               reduction=reduction)


def test_scatter_nd_add_repeated():
    check_node("ScatterND", {"x": f32(5), "i": i64([[1], [1], [4]]), "u": f32(3)},
               reduction="add")


# -- TopK -------------------------------------------------------------------------------------


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_top_k(largest, axis):
    check_node("TopK", {"x": f32(4, 5, 3)}, outputs=("v", "i"),
               initializers={"k": i64([2])}, axis=axis, largest=largest)


@pytest.mark.parametrize("largest", [0, 1])
def test_top_k_ties_keep_order(largest):
    check_node("TopK", {"x": np.array([[3, 1, 3, 2, 1, 3]], np.int64)}, outputs=("v", "i"),
               initializers={"k": i64([4])}, largest=largest)


def test_top_k_whole_axis_and_zero():
    check_node("TopK", {"x": f32(2, 4)}, outputs=("v", "i"), initializers={"k": i64([4])})
    check_node("TopK", {"x": f32(2, 4)}, outputs=("v", "i"), initializers={"k": i64([0])})


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd_empty_index_vectors(batch_dims):
    # Empty index vectors select the whole (per-batch) data; the reference
    # evaluator cannot reshape them: against numpy.
    x, indices = f32(2, 3), np.zeros((2, 0), np.int64)
    model = node_model("GatherND", {"x": x, "i": indices}, batch_dims=batch_dims)
    (got,) = run_mlxprog(model, {"x": x, "i": indices})
    np.testing.assert_array_equal(got, np.broadcast_to(x, (2, 2, 3)) if batch_dims == 0 else x)


def test_gather_nd_int32_indices_int_data():
    check_node("GatherND", {"x": np.arange(24, dtype=np.int64).reshape(2, 3, 4),
                            "i": np.array([[[2], [0]], [[1], [1]]], np.int32)}, batch_dims=1)


def test_reverse_sequence_and_bad_axes():
    from mlxprog.onnx import OnnxImportError, import_model

    x = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
    lens = np.array([4, 1, 3], np.int64)
    check_node("ReverseSequence", {"x": x, "lens": lens}, time_axis=0, batch_axis=1)
    check_node("ReverseSequence", {"x": x.transpose(1, 0, 2).copy(), "lens": lens},
               time_axis=1, batch_axis=0)
    with pytest.raises(OnnxImportError, match="time_axis=2"):
        import_model(node_model("ReverseSequence", {"x": x, "lens": lens}, time_axis=2))


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_and_bad_mode(mode):
    from mlxprog.onnx import OnnxImportError, import_model

    cache = np.zeros((2, 3, 6, 4), np.float32)
    update = np.ones((2, 3, 3, 4), np.float32)
    inputs = {"cache": cache, "update": update, "at": np.array([1, 4 if mode == "circular"
                                                                else 3], np.int64)}
    check_model(node_model("TensorScatter", inputs, opset=24, mode=mode), inputs)
    with pytest.raises(OnnxImportError, match="mode='ring'"):
        import_model(node_model("TensorScatter", inputs, opset=24, mode="ring"))
