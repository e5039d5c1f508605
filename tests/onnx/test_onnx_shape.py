"""Shape and layout converters against ONNX's reference evaluator."""

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx_cases import (
    check_model, check_node, graph_model, i64, node_model, normal_f32, run_mlxprog,
)

from mlxprog.onnx import OnnxImportError, import_model

rng = np.random.default_rng(0)

f32 = normal_f32(rng)



F = onnx.TensorProto.FLOAT


# -- Shape, Size ---------------------------------------------------------------------


@pytest.mark.parametrize("attrs", [{}, {"start": 1}, {"end": -1}, {"start": -2, "end": 10},
                                   {"start": 3, "end": 1}])
def test_shape(attrs):
    check_node("Shape", {"x": f32(2, 3, 4)}, **attrs)


def test_size():
    check_node("Size", {"x": f32(2, 3, 4)})


def test_symbolic_shape_reshape_chain():
    # Shape -> Gather -> Concat -> Reshape with a symbolic batch dim.
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b1"], axis=0),
             helper.make_node("Concat", ["b1", "tail"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    model = graph_model(nodes, [("x", F, ["N", 3, 4])], ["y"],
                        [("zero", i64(0)), ("tail", i64(-1))])
    for n in (2, 5):
        check_model(model, {"x": f32(n, 3, 4)})


def test_symbolic_shape_slice_and_expand():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "st", "en"], ["s2"]),
             helper.make_node("Concat", ["s2", "last"], ["shape"], axis=0),
             helper.make_node("Expand", ["x", "shape"], ["y"])]
    model = graph_model(nodes, [("x", F, ["N", 1])], ["y"],
                        [("st", i64(0)), ("en", i64(1)), ("last", i64(3))])
    check_model(model, {"x": f32(4, 1)})


def test_symbolic_flatten_and_split():
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=1),
             helper.make_node("Split", ["f"], ["a", "b"], axis=1, num_outputs=2)]
    model = graph_model(nodes, [("x", F, ["N", 2, 3])], ["a", "b"])
    check_model(model, {"x": f32(3, 2, 3)})


def test_symbolic_slice_of_symbolic_axis():
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"])]
    model = graph_model(nodes, [("x", F, ["T", 4])], ["y"],
                        [("st", i64(1)), ("en", i64(2 ** 63 - 1)), ("ax", i64(0))])
    check_model(model, {"x": f32(6, 4)})
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"])]
    model = graph_model(nodes, [("x", F, ["T", 4])], ["y"],
                        [("st", i64(0)), ("en", i64(-1)), ("ax", i64(0))])
    check_model(model, {"x": f32(6, 4)})


@pytest.mark.parametrize("start,end,step", [(-1, 2 ** 63 - 1, 1), (-3, -1, 1), (1, 4, 2),
                                            (0, 2 ** 31 - 1, 2), (2, -2, 1)])
def test_symbolic_slice_bounds_on_symbolic_axis(start, end, step):
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])]
    model = graph_model(nodes, [("x", F, [2, "T", 3])], ["y"],
                        [("st", i64(start)), ("en", i64(end)), ("ax", i64(1)),
                         ("sp", i64(step))])
    for t in (5, 8):
        check_model(model, {"x": f32(2, t, 3)})


def test_symbolic_slice_end_from_shape():
    # A static table sliced to the length of a symbolic input (position embeddings).
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "one", "two"], ["t"]),
             helper.make_node("Slice", ["table", "zero", "t", "one"], ["y"])]
    model = graph_model(nodes, [("x", F, [2, "T"])], ["y"],
                        [("one", i64(1)), ("two", i64(2)), ("zero", i64(0)),
                         ("table", f32(3, 16))])
    check_model(model, {"x": f32(2, 5)})


def test_symbolic_slice_start_from_shape():
    # The tail of a static buffer from a symbolic offset.
    nodes = [helper.make_node("Shape", ["x"], ["t"]),
             helper.make_node("Slice", ["buf", "t", "big"], ["y"])]
    model = graph_model(nodes, [("x", F, ["T"])], ["y"],
                        [("big", i64(2 ** 63 - 1)), ("buf", f32(12))])
    check_model(model, {"x": f32(5)})


# -- Reshape, Flatten, Squeeze, Unsqueeze, Transpose --------------------------------


@pytest.mark.parametrize("shape", [i64(4, 6), i64(0, -1), i64(-1), i64(2, 0, -1), i64(24, 1)])
def test_reshape(shape):
    check_node("Reshape", {"x": f32(2, 3, 4)}, initializers={"shape": shape})


def test_reshape_allowzero():
    check_node("Reshape", {"x": np.zeros((0, 3), np.float32)},
               initializers={"shape": i64(3, 0)}, allowzero=1)


def test_reshape_to_scalar():
    check_node("Reshape", {"x": f32(1, 1)}, initializers={"shape": np.zeros(0, np.int64)})


def test_symbolic_expand_static_target_decides():
    # x [N, 1] expanded by [3, 4]: N is taken to be 3 (the input's dim is kept).
    model = graph_model([helper.make_node("Expand", ["x", "shape"], ["y"])],
                        [("x", F, ["N", 1])], ["y"], [("shape", i64(3, 4))])
    check_model(model, {"x": f32(3, 1)})


def test_reshape_int64_data():
    check_node("Reshape", {"x": np.arange(6, dtype=np.int64)},
               initializers={"shape": i64(3, 2)})


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis):
    check_node("Flatten", {"x": f32(2, 3, 4)}, axis=axis)


@pytest.mark.parametrize("axes", [None, i64(0), i64(-1), i64(0, 2)])
def test_squeeze(axes):
    init = {} if axes is None else {"axes": axes}
    check_node("Squeeze", {"x": f32(1, 3, 1)}, initializers=init)


@pytest.mark.parametrize("axes", [i64(0), i64(-1), i64(1, 3), i64(-1, 0)])
def test_unsqueeze(axes):
    check_node("Unsqueeze", {"x": f32(2, 3)}, initializers={"axes": axes})


def test_unsqueeze_scalar():
    check_node("Unsqueeze", {"x": np.array(3.0, np.float32)}, initializers={"axes": i64(0)})


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1], [0, 1, 2]])
def test_transpose(perm):
    attrs = {} if perm is None else {"perm": perm}
    check_node("Transpose", {"x": f32(2, 3, 4)}, **attrs)


# -- Expand, Tile, Concat, Split --------------------------------------------------------


@pytest.mark.parametrize("xs,shape", [((3, 1), (2, 1, 6)), ((3, 1), (3, 4)),
                                      ((1, 4), (1,)), ((2, 3), (2, 1, 3)),
                                      ((3, 1), (1, 1))])
def test_expand(xs, shape):
    check_node("Expand", {"x": f32(*xs)}, initializers={"shape": i64(*shape)})


def test_expand_bool():
    check_node("Expand", {"x": np.array([[True], [False]])}, initializers={"shape": i64(2, 3)})


@pytest.mark.parametrize("repeats", [(1, 1), (2, 3), (1, 2), (3, 1), (0, 2)])
def test_tile(repeats):
    check_node("Tile", {"x": f32(2, 3)}, initializers={"repeats": i64(*repeats)})


def test_tile_int():
    check_node("Tile", {"x": np.arange(3, dtype=np.int32)}, initializers={"repeats": i64(2)})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    shapes = {0: [(1, 3), (2, 3)], 1: [(2, 1), (2, 2)], -1: [(2, 1), (2, 2)]}[axis]
    check_node("Concat", {"a": f32(*shapes[0]), "b": f32(*shapes[1])}, axis=axis)


def test_concat_with_initializer_and_empty():
    check_node("Concat", {"a": f32(2, 2)},
               initializers={"b": f32(2, 3), "c": np.zeros((2, 0), np.float32)}, axis=1)


def test_split_equal():
    check_node("Split", {"x": f32(6, 2)}, outputs=("a", "b", "c"), axis=0)


def test_split_sizes():
    check_node("Split", {"x": f32(2, 7)}, outputs=("a", "b"),
               initializers={"split": i64(3, 4)}, axis=-1)


def test_split_num_outputs_uneven():
    check_node("Split", {"x": f32(7, 2)}, outputs=("a", "b", "c"), num_outputs=3)


def test_split_zero_size_part():
    check_node("Split", {"x": f32(4)}, outputs=("a", "b"), initializers={"split": i64(0, 4)})


# -- Slice ----------------------------------------------------------------------------------


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ((0, 1), (2, 3), None, None),
    ((1,), (1000,), (1,), None),
    ((-3,), (-1,), (-1,), None),
    ((0,), (-1,), (0,), (2,)),
    ((-1,), (-1000,), (1,), (-1,)),
    ((3,), (0,), (2,), (-2,)),
    ((2 ** 63 - 1,), (-(2 ** 63),), (0,), (-1,)),
    ((5,), (10,), (2,), None),           # empty
    ((2, 0), (1, 5), (2, 1), (-1, 3)),
    ((0,), (2 ** 63 - 1,), (0,), (3,)),
])
def test_slice(starts, ends, axes, steps):
    init = {"starts": i64(*starts), "ends": i64(*ends)}
    if axes is not None:
        init["axes"] = i64(*axes)
    if steps is not None:
        init["steps"] = i64(*steps)
    check_node("Slice", {"x": f32(3, 4, 5)}, initializers=init)


def test_slice_int32_params():
    check_node("Slice", {"x": f32(6)},
               initializers={"starts": np.array([1], np.int32), "ends": np.array([5], np.int32),
                             "axes": np.array([0], np.int32), "steps": np.array([2], np.int32)})


# -- Pad ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [(1, 2, 2, 1), (0, 0, 3, 0), (0, 3, 0, 3)])
def test_pad(mode, pads):
    check_node("Pad", {"x": f32(3, 4)}, initializers={"pads": i64(*pads)}, mode=mode)


def test_pad_constant_value_and_axes():
    check_node("Pad", {"x": f32(2, 3, 4)},
               initializers={"pads": i64(1, 2, 0, 1), "value": np.array(1.5, np.float32),
                             "axes": i64(-1, 0)})


def test_pad_runtime_constant_value():
    model = graph_model([helper.make_node("Pad", ["x", "pads", "v"], ["y"])],
                        [("x", F, [2, 3]), ("v", F, [])], ["y"],
                        [("pads", i64(1, 0, 1, 2))])
    check_model(model, {"x": f32(2, 3), "v": np.array(7.0, np.float32)})


@pytest.mark.parametrize("mode", ["constant", "edge", "wrap"])
def test_pad_negative_crops(mode):
    # The reference evaluator (np.pad) refuses negative pads: crop by hand.
    x = f32(4, 5)
    model = node_model("Pad", {"x": x}, initializers={"pads": i64(-1, 2, 1, -2)}, mode=mode)
    (got,) = run_mlxprog(model, {"x": x})
    want = np.pad(x[1:, :3], [(0, 1), (2, 0)], mode=mode)
    np.testing.assert_array_equal(got, want)


def test_pad_int():
    check_node("Pad", {"x": np.arange(6, dtype=np.int64).reshape(2, 3)},
               initializers={"pads": i64(1, 1, 1, 1), "value": np.array(-1, np.int64)})


def test_pad_wrap_large():
    check_node("Pad", {"x": f32(2, 3)}, initializers={"pads": i64(0, 4, 0, 5)}, mode="wrap")


# -- Identity, DepthToSpace, SpaceToDepth ------------------------------------------------


def test_identity():
    check_node("Identity", {"x": np.arange(4, dtype=np.int32)})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    check_node("DepthToSpace", {"x": f32(2, 8, 2, 3)}, blocksize=2, mode=mode)


@pytest.mark.parametrize("mode", [None, "DCR", "CRD"])
def test_space_to_depth(mode):
    attrs = {} if mode is None else {"mode": mode}
    model = node_model("SpaceToDepth", {"x": f32(2, 3, 4, 6)}, opset=28, blocksize=2, **attrs)
    check_model(model, {"x": f32(2, 3, 4, 6)})


def test_reshape_runtime_shape_is_refused():
    model = graph_model([helper.make_node("Reshape", ["x", "s"], ["y"])],
                        [("x", F, [2, 3]), ("s", onnx.TensorProto.INT64, [2])], ["y"])
    with pytest.raises(OnnxImportError, match="must be known at import"):
        import_model(model)


def test_symbolic_run_twice():
    model = graph_model([helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])],
                        [("x", F, ["N", 3])], ["y"])
    out = run_mlxprog(model, {"x": np.ones((5, 3), np.float32)})
    assert out[0].shape == (3, 5)


def test_symbolic_tile_and_depth_to_space():
    nodes = [helper.make_node("Tile", ["x", "r"], ["t"]),
             helper.make_node("DepthToSpace", ["t", ], ["y"], blocksize=2)]
    model = graph_model(nodes, [("x", F, ["N", 4, "H", 3])], ["y"], [("r", i64(1, 2, 1, 2))])
    check_model(model, {"x": f32(2, 4, 5, 3)})


def test_symbolic_pad_and_squeeze():
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], mode="edge"),
             helper.make_node("Squeeze", ["p", "ax"], ["y"])]
    model = graph_model(nodes, [("x", F, ["N", 1, 3])], ["y"],
                        [("pads", i64(0, 0, 1, 0, 0, 2)), ("ax", i64(1))])
    check_model(model, {"x": f32(4, 1, 3)})


def test_center_crop_pad_and_bad_shape():
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    check_node("CenterCropPad", {"x": x}, initializers={"s": np.array([7, 2], np.int64)},
               axes=[-1, 1])
    with pytest.raises(OnnxImportError, match="one size per axis"):
        import_model(node_model("CenterCropPad", {"x": x},
                                initializers={"s": np.array([7, 2, 1], np.int64)}, axes=[0]))
