"""ONNX reduction, arg-reduction and CumSum converters against the reference evaluator."""

import numpy as np
import pytest

import onnx_cases
from onnx_cases import check_model, check_node, node_model


RNG = np.random.default_rng(0)



REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
          "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]
NO_INT = {"ReduceLogSum", "ReduceLogSumExp"}  # the reference rejects integers


def data(op, dtype, shape=(2, 3, 4)):
    if np.issubdtype(dtype, np.integer):
        lo = 1 if op == "ReduceProd" else -6
        return RNG.integers(lo, 4 if op == "ReduceProd" else 7, shape).astype(dtype)
    lo = 0.1 if op == "ReduceLogSum" else -2.0
    return RNG.uniform(lo, 2.0, shape).astype(dtype)


AXES = [None, [1], [-1], [0, 2], [2, 0, 1]]


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("axes", AXES, ids=str)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_axes_input(op, axes, keepdims):
    x = data(op, np.float32)
    inits = {} if axes is None else {"axes": np.array(axes, np.int64)}
    check_node(op, {"x": x}, initializers=inits, keepdims=keepdims, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64])
def test_reduce_dtypes(op, dtype):
    if op in NO_INT and np.issubdtype(dtype, np.integer):
        pytest.skip("integers are not defined for this reduction")
    x = data(op, dtype)
    if op == "ReduceSumSquare" and dtype == np.int32:
        # The reference's np.sum promotes int32 to int64; ONNX keeps int32.
        model = node_model(op, {"x": x}, initializers={"axes": np.array([1], np.int64)})
        out, = onnx_cases.run_mlxprog(model, {"x": x})
        assert out.dtype == np.int32
        np.testing.assert_array_equal(out, (x.astype(np.int64) ** 2).sum(1, keepdims=True))
        return
    check_node(op, {"x": x}, initializers={"axes": np.array([1], np.int64)}, keepdims=0)
    check_node(op, {"x": x}, keepdims=1)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceProd"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16])
def test_reduce_small_ints_keep_their_type(op, dtype):
    x = RNG.integers(1, 3, (3, 4)).astype(dtype)
    check_node(op, {"x": x}, initializers={"axes": np.array([0], np.int64)})


def test_reduce_mean_integer_truncates():
    x = np.array([[1, 2], [-3, -4], [5, -2]], np.int32)
    out, = check_node("ReduceMean", {"x": x}, initializers={"axes": np.array([1], np.int64)},
                      keepdims=0)
    np.testing.assert_array_equal(out, [1, -3, 1])


@pytest.mark.parametrize("op", REDUCE)
def test_reduce_noop_with_empty_axes(op):
    x = data(op, np.float32)
    check_node(op, {"x": x}, noop_with_empty_axes=1)
    check_node(op, {"x": x}, initializers={"axes": np.zeros((0,), np.int64)},
               noop_with_empty_axes=1)
    check_node(op, {"x": x}, initializers={"axes": np.zeros((0,), np.int64)})


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_empty_input(op, keepdims):
    x = np.zeros((2, 0, 3), np.float32)
    check_node(op, {"x": x}, initializers={"axes": np.array([1], np.int64)}, keepdims=keepdims)
    check_node(op, {"x": x}, keepdims=keepdims)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_empty_int(op):
    check_node(op, {"x": np.zeros((0, 3), np.int32)},
               initializers={"axes": np.array([0], np.int64)})


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_bool(op):
    check_node(op, {"x": RNG.integers(0, 2, (3, 4)).astype(bool)},
               initializers={"axes": np.array([1], np.int64)})


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax", "ReduceL2", "ReduceLogSumExp"])
def test_reduce_axes_attribute_before_opset_18(op):
    model = node_model(op, {"x": data(op, np.float32)}, opset=13, axes=[0, -1], keepdims=0)
    check_model(model, {"x": data(op, np.float32)}, atol=1e-5)


def test_reduce_sum_opset_13_takes_the_input():
    model = node_model("ReduceSum", {"x": data("ReduceSum", np.float32)},
                       initializers={"axes": np.array([1], np.int64)}, opset=13)
    check_model(model, {"x": data("ReduceSum", np.float32)})


def test_reduce_log_sum_exp_infinities():
    x = np.array([[-np.inf, -np.inf], [np.inf, 1.0], [1000.0, 1000.0], [-np.inf, 2.0]],
                 np.float32)
    # log(sum(exp(x))): -inf for a row of -inf (the reference computes NaN there).
    model = node_model("ReduceLogSumExp", {"x": x},
                       initializers={"axes": np.array([1], np.int64)}, keepdims=0)
    out, = onnx_cases.run_mlxprog(model, {"x": x})
    np.testing.assert_allclose(out, [-np.inf, np.inf, 1000 + np.log(2), 2.0], rtol=1e-6)
    check_node("ReduceLogSumExp", {"x": x[1:]}, initializers={"axes": np.array([1], np.int64)})


def test_reduce_max_nan():
    x = np.array([[np.nan, 1.0], [2.0, 1.0]], np.float32)
    check_node("ReduceMax", {"x": x}, initializers={"axes": np.array([1], np.int64)})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_reduce(op, axis, keepdims, last):
    x = RNG.integers(0, 3, (3, 4, 2)).astype(np.float32)  # ties on purpose
    out, = check_node(op, {"x": x}, axis=axis, keepdims=keepdims, select_last_index=last)
    assert out.dtype == np.int64


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64, np.uint8])
def test_arg_reduce_dtypes(op, dtype):
    x = RNG.integers(0, 5, (4, 3)).astype(dtype)
    check_node(op, {"x": x})
    check_node(op, {"x": x}, axis=1, keepdims=0, select_last_index=1)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum(exclusive, reverse, axis):
    x = RNG.uniform(-2, 2, (3, 4)).astype(np.float32)
    check_node("CumSum", {"x": x}, initializers={"axis": np.array(axis, np.int64)},
               exclusive=exclusive, reverse=reverse)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64, np.uint32])
@pytest.mark.parametrize("axis_dtype", [np.int32, np.int64])
def test_cumsum_dtypes(dtype, axis_dtype):
    x = RNG.integers(0, 9, (2, 5)).astype(dtype)
    check_node("CumSum", {"x": x}, initializers={"axis": np.array(1, axis_dtype)}, exclusive=1)
    check_node("CumSum", {"x": x}, initializers={"axis": np.array(0, axis_dtype)}, reverse=1)


def test_cumsum_empty():
    check_node("CumSum", {"x": np.zeros((0, 3), np.float32)},
               initializers={"axis": np.array(1, np.int64)})


def symbolic_model(op, x, initializers=None, **attrs):
    """A one-node model whose input ``x`` has a symbolic first dim ``N``."""
    import onnx
    from onnx import helper, numpy_helper

    initializers = initializers or {}
    node = helper.make_node(op, ["x", *initializers], ["y"], **attrs)
    spec = helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype),
                                         ["N", *x.shape[1:]])
    graph = helper.make_graph([node], "case", [spec],
                              [helper.make_value_info("y", onnx.TypeProto())],
                              [numpy_helper.from_array(a, n) for n, a in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", onnx_cases.OPSET)])


@pytest.mark.parametrize("op,attrs,inits", [
    ("ReduceMean", {}, {"axes": np.array([0], np.int64)}),
    ("ReduceMean", {"keepdims": 0}, {}),
    ("ReduceLogSumExp", {}, {"axes": np.array([0], np.int64)}),
    ("ReduceMax", {"keepdims": 0}, {"axes": np.array([0], np.int64)}),
    ("ArgMax", {"axis": 0, "select_last_index": 1}, {}),
    ("ArgMin", {"axis": 0, "select_last_index": 1, "keepdims": 0}, {}),
    ("CumSum", {"exclusive": 1}, {"axis": np.array(0, np.int64)}),
], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_symbolic_batch(op, attrs, inits, dtype):
    if op == "ReduceLogSumExp" and dtype == np.int32:
        pytest.skip("integers are not defined for this reduction")
    model = symbolic_model(op, np.zeros((1, 3), dtype), inits, **attrs)
    for n in (2, 5):
        check_model(model, {"x": RNG.integers(-3, 3, (n, 3)).astype(dtype)})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2",
                                "ReduceLogSumExp"])
def test_reduce_float16(op):
    x = RNG.uniform(-1, 1, (4, 8)).astype(np.float16)
    check_node(op, {"x": x}, initializers={"axes": np.array([1], np.int64)},
               rtol=5e-3, atol=5e-3)


def test_argmax_nan_is_the_maximum():
    x = np.array([[1, np.nan, 3, np.nan], [np.nan, 1, 2, 0]], np.float32)
    for op in ("ArgMax", "ArgMin"):
        for last in (0, 1):
            check_node(op, {"x": x}, axis=1, select_last_index=last)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumprod(exclusive, reverse, axis):
    x = RNG.uniform(-2, 2, (3, 4)).astype(np.float32)
    model = node_model("CumProd", {"x": x}, initializers={"axis": np.array(axis, np.int64)},
                       opset=26, exclusive=exclusive, reverse=reverse)
    check_model(model, {"x": x}, 1e-5, 1e-6)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_cumprod_dtypes(dtype):
    x = RNG.integers(1, 4, (2, 5)).astype(dtype)
    for axis, attrs in [(1, {"exclusive": 1}), (0, {"reverse": 1})]:
        model = node_model("CumProd", {"x": x}, initializers={"axis": np.array(axis, np.int32)},
                           opset=26, **attrs)
        check_model(model, {"x": x}, 1e-5, 1e-6)
