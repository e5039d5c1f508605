"""The vision converters (convert/vision.py) against ONNX's reference evaluator."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx_cases import OPSET, check_model, check_node, node_model, value_info

from mlxprog.onnx import import_model

RNG = np.random.default_rng(1)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def resize(x, *, scales=None, sizes=None, roi=None, rtol=1e-5, atol=1e-5, **attrs):
    inits = {"roi": np.array([], np.float32) if roi is None else np.asarray(roi, np.float32)}
    if scales is not None:
        inits["scales"] = np.asarray(scales, np.float32)
    else:
        inits["scales"] = np.array([], np.float32)
        inits["sizes"] = np.asarray(sizes, np.int64)
    return check_node("Resize", {"x": x}, initializers=inits, rtol=rtol, atol=atol, **attrs)


COORDS = ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
          "half_pixel_symmetric"]


@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor",
                                          "ceil"])
def test_resize_nearest(coord, nearest_mode):
    x = rand(1, 2, 4, 5)
    resize(x, scales=[1, 1, 2, 1.5], mode="nearest", coordinate_transformation_mode=coord,
           nearest_mode=nearest_mode)
    resize(x, sizes=[1, 2, 3, 2], mode="nearest", coordinate_transformation_mode=coord,
           nearest_mode=nearest_mode)


@pytest.mark.parametrize("coord", COORDS)
def test_resize_linear(coord):
    x = rand(2, 3, 4, 5)
    resize(x, scales=[1, 1, 2, 1.5], mode="linear", coordinate_transformation_mode=coord)
    resize(x, sizes=[2, 3, 3, 2], mode="linear", coordinate_transformation_mode=coord)
    resize(x, sizes=[2, 3, 1, 7], mode="linear", coordinate_transformation_mode=coord)


@pytest.mark.parametrize("coord", ["half_pixel", "asymmetric", "align_corners"])
def test_resize_cubic(coord):
    x = rand(1, 1, 4, 4)
    resize(x, scales=[1, 1, 2, 2], mode="cubic", coordinate_transformation_mode=coord,
           rtol=1e-4, atol=1e-5)
    resize(x, sizes=[1, 1, 3, 6], mode="cubic", coordinate_transformation_mode=coord,
           cubic_coeff_a=-0.5, exclude_outside=1, rtol=1e-4, atol=1e-5)


def test_resize_antialias_downsampling():
    x = rand(1, 1, 8, 8)
    resize(x, sizes=[1, 1, 3, 5], mode="linear", antialias=1, rtol=1e-4, atol=1e-5)
    resize(x, scales=[1, 1, 0.5, 0.6], mode="cubic", antialias=1, rtol=1e-4, atol=1e-5)


def test_resize_axes_and_aspect_policy():
    x = rand(1, 2, 4, 6)
    resize(x, sizes=[8, 9], axes=[2, 3], mode="linear", keep_aspect_ratio_policy="not_larger")
    resize(x, sizes=[8, 9], axes=[2, 3], mode="nearest",
           keep_aspect_ratio_policy="not_smaller")
    resize(x, scales=[3.0], axes=[3], mode="linear")


def test_resize_tf_crop_and_resize():
    x = rand(1, 1, 5, 5)
    resize(x, sizes=[1, 1, 4, 3], roi=[0, 0, 0.2, -0.1, 1, 1, 0.8, 1.3], mode="linear",
           coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=7.0)


def test_resize_integer_nearest_and_1d_5d():
    x = RNG.integers(0, 100, (1, 2, 3, 3)).astype(np.int32)
    resize(x, scales=[1, 1, 2, 2], mode="nearest")
    resize(rand(2, 3, 5), scales=[1, 1, 1.6], mode="linear")
    resize(rand(1, 1, 2, 3, 2), scales=[1, 1, 2, 1, 1.5], mode="nearest")


def test_resize_channels_last_input_stays_channels_last():
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Resize", ["c", "", "scales"], ["r"], mode="nearest"),
        helper.make_node("Conv", ["r", "w2"], ["y"]),
    ]
    inits = {"w": rand(4, 3, 3, 3), "scales": np.array([1, 1, 2, 2], np.float32),
             "w2": rand(2, 4, 1, 1)}
    graph = helper.make_graph(nodes, "g", [value_info("x", rand(1, 3, 5, 5))],
                              [helper.make_value_info("y", onnx.TypeProto())],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    check_model(model, {"x": rand(1, 3, 5, 5)}, rtol=1e-4, atol=1e-4)
    program, _ = import_model(model)
    assert [i.op for i in program.instructions].count("transpose") == 2


def test_upsample_nearest():
    x = rand(1, 2, 3, 4)
    node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest")
    graph = helper.make_graph([node], "g", [value_info("x", x)],
                              [helper.make_value_info("y", onnx.TypeProto())],
                              [numpy_helper.from_array(np.array([1, 1, 2, 3], np.float32),
                                                       "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    # Opset 9 is converted to 13 on import (Upsample becomes Resize); compare with the
    # reference's Upsample.
    check_model(model, {"x": x})


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample(mode, padding, align):
    x = rand(2, 2, 4, 5)
    grid = (RNG.random((2, 3, 4, 2)) * 3 - 1.5).astype(np.float32)  # some outside [-1, 1]
    check_node("GridSample", {"x": x, "grid": grid}, mode=mode, padding_mode=padding,
               align_corners=align, rtol=1e-4, atol=1e-5)


def test_grid_sample_3d_linear():
    x = rand(1, 2, 3, 4, 5)
    grid = (RNG.random((1, 2, 3, 2, 3)) * 2.4 - 1.2).astype(np.float32)
    check_node("GridSample", {"x": x, "grid": grid}, mode="linear", rtol=1e-4, atol=1e-5)


def test_affine_grid_and_bad_theta():
    from mlxprog.onnx import OnnxImportError, import_model

    theta = np.random.default_rng(6).standard_normal((2, 2, 3)).astype(np.float32)
    for align in (0, 1):
        model = node_model("AffineGrid", {"theta": theta}, opset=20, align_corners=align,
                           initializers={"size": np.array([2, 3, 4, 5], np.int64)})
        check_model(model, {"theta": theta})
    with pytest.raises(OnnxImportError, match=r"theta \[2, 2, 3\] and size"):
        import_model(node_model("AffineGrid", {"theta": theta}, opset=20,
                                initializers={"size": np.array([2, 3, 4, 5, 6], np.int64)}))


def test_col2im_and_bad_columns():
    from mlxprog.onnx import OnnxImportError, import_model

    x = np.random.default_rng(7).standard_normal((2, 2 * 4, 12)).astype(np.float32)
    shapes = {"image": np.array([4, 5], np.int64), "block": np.array([2, 2], np.int64)}
    check_node("Col2Im", {"x": x}, initializers=shapes, pads=[1, 0, 0, 1], strides=[1, 2])
    with pytest.raises(OnnxImportError, match=r"must be \[N, C \* 4, 4\]"):
        import_model(node_model("Col2Im", {"x": x}, initializers=shapes, strides=[2, 2]))


def test_roi_align_and_runtime_rois():
    from mlxprog.onnx import OnnxImportError, import_model

    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    rois = np.array([[0.5, 1.0, 4.0, 5.5], [0.0, 0.0, 6.5, 5.0], [3, 3, 3.2, 3.1]], np.float32)
    batch = np.array([1, 0, 1], np.int64)
    for mode in ("avg", "max"):
        check_model(node_model("RoiAlign", {"x": x}, initializers={"rois": rois, "batch": batch},
                               mode=mode, output_height=2, output_width=3, spatial_scale=0.9),
                    {"x": x}, rtol=1e-5, atol=1e-5)
    model = node_model("RoiAlign", {"x": x, "rois": rois, "batch": batch})
    with pytest.raises(OnnxImportError, match="rois.*must be known at"):
        import_model(model)
