"""Type and creation converters against ONNX's reference evaluator."""

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from onnx_cases import check_model, check_node, graph_model, i64, normal_f32

rng = np.random.default_rng(1)

f32 = normal_f32(rng)



# -- Cast, CastLike ---------------------------------------------------------------------

FLOATS = np.array([-2.7, -1.5, -0.5, 0.0, 0.4, 1.5, 2.9, 100.2], np.float32)


@pytest.mark.parametrize("to", [T.INT64, T.INT32, T.INT8, T.BOOL, T.FLOAT16, T.DOUBLE,
                                T.FLOAT])
def test_cast_from_float(to):
    check_node("Cast", {"x": FLOATS}, to=to)


@pytest.mark.parametrize("to", [T.FLOAT, T.INT32, T.BOOL, T.UINT8])
def test_cast_from_int64(to):
    check_node("Cast", {"x": np.array([0, 1, 5, 200], np.int64)}, to=to)


@pytest.mark.parametrize("to", [T.FLOAT, T.INT64, T.INT32])
def test_cast_from_bool(to):
    check_node("Cast", {"x": np.array([True, False, True])}, to=to)


def test_cast_like():
    check_node("CastLike", {"x": FLOATS, "like": np.zeros(1, np.int32)})


def test_cast_like_same_type():
    check_node("CastLike", {"x": FLOATS, "like": np.zeros(2, np.float32)})


def test_bfloat16_end_to_end():
    """bfloat16 inputs, initializers (a capture: its weight an mx.array),
    a Cast to and from it, and outputs: the backend takes and gives ONNX's
    NumPy form of it (``ml_dtypes.bfloat16``)."""
    import ml_dtypes
    import mlx.core as mx
    from onnx.reference import ReferenceEvaluator

    from mlxprog.onnx.backend import MlxprogBackend

    bf16 = ml_dtypes.bfloat16
    x = np.array([[1.5, -2.25, 3.0]], bf16)
    w = np.arange(300, dtype=np.float32).reshape(100, 3).astype(bf16)  # a capture
    nodes = [helper.make_node("Add", ["x", "w"], ["s"]),
             helper.make_node("Cast", ["s"], ["f"], to=T.FLOAT),
             helper.make_node("Cast", ["f"], ["y"], to=T.BFLOAT16)]
    model = graph_model(nodes, [("x", T.BFLOAT16, [1, 3])], ["f", "y"],
                        initializers=[("w", w)])
    rep = MlxprogBackend.prepare(model)
    assert rep.weights["w"].dtype == mx.bfloat16
    f, y = rep.run([x])
    want_f, want_y = ReferenceEvaluator(model).run(None, {"x": x})
    assert f.dtype == np.float32 and y.dtype == bf16
    np.testing.assert_array_equal(f, want_f)
    np.testing.assert_array_equal(y.astype(np.float32), want_y.astype(np.float32))


# -- ConstantOfShape, Range (symbolic: static ones are folded at import) -----------------


@pytest.mark.parametrize("value", [None, np.array([2.5], np.float32), np.array([7], np.int64),
                                   np.array([True])])
def test_constant_of_shape_symbolic(value):
    attrs = {} if value is None else {"value": numpy_helper.from_array(value, "value")}
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["y"], **attrs)]
    model = graph_model(nodes, [("x", T.FLOAT, ["N", 3])], ["y"])
    check_model(model, {"x": f32(4, 3)})


def test_constant_of_shape_static_is_folded():
    check_node("ConstantOfShape", {}, initializers={"s": i64(2, 3)})


def test_range_symbolic():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i"], ["n"], axis=0),
             helper.make_node("Range", ["start", "n", "delta"], ["y"])]
    model = graph_model(nodes, [("x", T.FLOAT, ["N"])], ["y"],
                        [("i", np.array(0, np.int64)), ("start", np.array(0, np.int64)),
                         ("delta", np.array(1, np.int64))])
    check_model(model, {"x": f32(5)})


# -- EyeLike, Trilu, Where ---------------------------------------------------------------------


@pytest.mark.parametrize("attrs", [{}, {"k": 1}, {"k": -2}, {"dtype": T.INT64}, {"k": 5}])
def test_eye_like(attrs):
    check_node("EyeLike", {"x": f32(3, 4)}, **attrs)


def test_eye_like_int_input():
    check_node("EyeLike", {"x": np.zeros((4, 2), np.int32)})


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 1, -1, 4, -5])
def test_trilu(upper, k):
    init = {} if k is None else {"k": np.array(k, np.int64)}
    check_node("Trilu", {"x": f32(2, 3, 4)}, initializers=init, upper=upper)


def test_trilu_int():
    check_node("Trilu", {"x": np.arange(9, dtype=np.int64).reshape(3, 3)}, upper=0)


def test_where_broadcast():
    check_node("Where", {"c": rng.random((2, 1, 4)) > 0.5, "x": f32(3, 4),
                         "y": np.array(0.5, np.float32)})


def test_where_int():
    check_node("Where", {"c": np.array([True, False, True]),
                         "x": np.array([1, 2, 3], np.int64), "y": np.array([7, 8, 9], np.int64)})


# -- OneHot ------------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis):
    check_node("OneHot", {"i": np.array([[0, 2], [-1, 5]], np.int64)},
               initializers={"depth": np.array(3, np.int64),
                             "values": np.array([-1.0, 4.0], np.float32)}, axis=axis)


def test_one_hot_float_indices_int_values():
    # Integral floats: the spec casts non-integer indices to int64 (as the
    # converter does); the reference evaluator compares them as floats.
    check_node("OneHot", {"i": np.array([1.0, 0.0, 3.0, -1.0], np.float32)},
               initializers={"depth": np.array(4, np.int64),
                             "values": np.array([0, 1], np.int32)})


@pytest.mark.parametrize("start,delta", [(2, 1), (0, 3), (1, 2)])
def test_range_symbolic_start_and_delta(start, delta):
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Squeeze", ["s"], ["n"]),
             helper.make_node("Range", ["start", "n", "delta"], ["y"])]
    model = graph_model(nodes, [("x", T.FLOAT, ["N"])], ["y"],
                        [("start", np.array(start, np.int64)),
                         ("delta", np.array(delta, np.int64))])
    for n in (5, 8, 9):
        check_model(model, {"x": f32(n)})


def test_bitcast_and_bad_width():
    from mlxprog.onnx import OnnxImportError, import_model
    from onnx_cases import node_model

    check_node("BitCast", {"x": np.array([1.5, -0.0, np.inf], np.float32)}, to=T.UINT32)
    with pytest.raises(OnnxImportError, match="to=int64 must have the width"):
        import_model(node_model("BitCast", {"x": FLOATS}, to=T.INT64))
