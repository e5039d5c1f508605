"""The nn converters (convert/nn.py) against ONNX's reference evaluator."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx_cases import (OPSET, check_model, check_node, node_model, run_mlxprog,
                        value_info)

from mlxprog.onnx import OnnxImportError, import_model

RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# -- Conv -------------------------------------------------------------------------------------

@pytest.mark.parametrize("attrs", [
    {},
    {"pads": [1, 1, 1, 1]},
    {"pads": [0, 1, 2, 1], "strides": [2, 1]},
    {"strides": [2, 2], "dilations": [2, 1], "pads": [1, 2, 1, 0]},
    {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"auto_pad": "SAME_LOWER", "strides": [2, 1]},
    {"auto_pad": "VALID", "strides": [1, 2]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
])
def test_conv2d_attributes(attrs):
    check_node("Conv", {"x": rand(2, 3, 7, 8)}, initializers={"w": rand(4, 3, 3, 3)},
               rtol=1e-4, atol=1e-4, **attrs)


@pytest.mark.parametrize("group", [2, 6])
def test_conv2d_groups_and_bias(group):
    check_node("Conv", {"x": rand(1, 6, 5, 5)},
               initializers={"w": rand(6, 6 // group, 3, 3), "b": rand(6)},
               group=group, pads=[1, 1, 1, 1], rtol=1e-4, atol=1e-4)


def test_conv1d_and_3d():
    check_node("Conv", {"x": rand(2, 3, 9)}, initializers={"w": rand(5, 3, 3), "b": rand(5)},
               strides=[2], pads=[1, 0], dilations=[2], rtol=1e-4, atol=1e-4)
    check_node("Conv", {"x": rand(1, 2, 4, 5, 6)}, initializers={"w": rand(3, 2, 2, 3, 2)},
               pads=[1, 0, 1, 0, 1, 1], strides=[1, 2, 1], rtol=1e-4, atol=1e-4)


def test_conv3d_groups():
    check_node("Conv", {"x": rand(1, 4, 4, 4, 4)}, initializers={"w": rand(6, 2, 3, 3, 3)},
               group=2, pads=[1] * 6, rtol=1e-4, atol=1e-4)


def test_conv_weight_as_graph_input():
    check_node("Conv", {"x": rand(1, 3, 6, 6), "w": rand(4, 3, 3, 3)}, pads=[1, 1, 1, 1],
               rtol=1e-4, atol=1e-4)


def test_conv_symbolic_batch():
    x = rand(2, 3, 6, 6)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                    ["N", 3, 6, 6])],
        [helper.make_value_info("y", onnx.TypeProto())],
        [numpy_helper.from_array(rand(4, 3, 3, 3), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    check_model(model, {"x": x}, rtol=1e-4, atol=1e-4)


# -- ConvTranspose ----------------------------------------------------------------------------

@pytest.mark.parametrize("attrs", [
    {},
    {"strides": [2, 2]},
    {"strides": [3, 2], "pads": [1, 0, 2, 1]},
    {"strides": [2, 2], "output_padding": [1, 1]},
    {"strides": [2, 2], "dilations": [2, 1], "pads": [1, 1, 0, 0]},
    {"strides": [2, 2], "output_shape": [8, 9], "auto_pad": "SAME_UPPER"},
    {"strides": [2, 2], "output_shape": [8, 10], "auto_pad": "SAME_LOWER"},
    {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"strides": [2, 2], "auto_pad": "SAME_LOWER"},
    {"pads": [3, 3, 3, 3]},  # pads beyond the kernel: cropped
])
def test_conv_transpose_2d(attrs):
    check_node("ConvTranspose", {"x": rand(1, 2, 4, 5)}, initializers={"w": rand(2, 3, 3, 3)},
               rtol=1e-4, atol=1e-4, **attrs)


def test_conv_transpose_groups():
    # The reference evaluator fails on groups: compare with one reference run per group.
    x, w, bias = rand(2, 4, 3, 3), rand(4, 3, 2, 2), rand(6)
    attrs = {"strides": [2, 2], "pads": [1, 0, 0, 1]}
    model = node_model("ConvTranspose", {"x": x}, initializers={"w": w, "b": bias}, group=2,
                       **attrs)
    (got,) = run_mlxprog(model, {"x": x})
    want = np.concatenate([
        ReferenceEvaluator(node_model("ConvTranspose", {"x": x[:, 2 * g:2 * g + 2]},
                                      initializers={"w": w[2 * g:2 * g + 2],
                                                    "b": bias[3 * g:3 * g + 3]}, **attrs)
                           ).run(None, {"x": x[:, 2 * g:2 * g + 2]})[0]
        for g in range(2)], axis=1)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv_transpose_1d_3d():
    check_node("ConvTranspose", {"x": rand(1, 2, 5)}, initializers={"w": rand(2, 3, 3)},
               strides=[2], pads=[1, 0], rtol=1e-4, atol=1e-4)
    check_node("ConvTranspose", {"x": rand(1, 2, 3, 2, 3)},
               initializers={"w": rand(2, 2, 2, 2, 2)}, strides=[2, 1, 2],
               rtol=1e-4, atol=1e-4)


# -- pools --------------------------------------------------------------------------------------

POOL_CASES = [
    {"kernel_shape": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 0, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [3, 3], "strides": [1, 1], "auto_pad": "SAME_LOWER"},
    {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"},
    {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},  # one extra at the end
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 1, 1]},
]


@pytest.mark.parametrize("attrs", POOL_CASES)
def test_max_pool(attrs):
    check_node("MaxPool", {"x": rand(2, 3, 7, 7)}, **attrs)


def test_max_pool_dilations_1d_3d():
    check_node("MaxPool", {"x": rand(1, 2, 8, 8)}, kernel_shape=[2, 2], dilations=[2, 2],
               strides=[1, 1])
    check_node("MaxPool", {"x": rand(1, 2, 9)}, kernel_shape=[3], strides=[2], pads=[1, 1])
    check_node("MaxPool", {"x": rand(1, 2, 4, 5, 6)}, kernel_shape=[2, 2, 2],
               strides=[2, 2, 2])


def test_max_pool_int():
    check_node("MaxPool", {"x": (RNG.integers(-100, 100, (1, 2, 5, 5))).astype(np.int8)},
               kernel_shape=[2, 2], pads=[1, 1, 1, 1], strides=[2, 2])


def test_max_pool_indices_stride_1_numpy():
    # The reference evaluator's indices are wrong for stride 1 (onnxruntime agrees with
    # this NumPy version).
    x = rand(2, 3, 5, 6)
    (y, i) = run_mlxprog(node_model("MaxPool", {"x": x}, outputs=("y", "i"),
                                    kernel_shape=[2, 3]), {"x": x})
    windows = np.lib.stride_tricks.sliding_window_view(x, (2, 3), axis=(2, 3))
    flat = windows.reshape(*windows.shape[:4], 6)
    best = flat.argmax(-1)
    oh, ow = np.meshgrid(np.arange(4), np.arange(4), indexing="ij")
    rows, cols = oh + best // 3, ow + best % 3
    plane = (np.arange(2)[:, None, None, None] * 3 + np.arange(3)[None, :, None, None]) * 30
    np.testing.assert_array_equal(y, flat.max(-1))
    np.testing.assert_array_equal(i, plane + rows * 6 + cols)
    assert i.dtype == np.int64


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 0, 1], "storage_order": 1},
    {"kernel_shape": [2, 2], "strides": [2, 2], "dilations": [2, 1]},
])
def test_max_pool_indices(attrs):
    check_node("MaxPool", {"x": rand(2, 3, 6, 7)}, outputs=("y", "i"), **attrs)
    check_node("MaxPool", {"x": rand(1, 2, 9)}, outputs=("y", "i"), kernel_shape=[3],
               strides=[2], pads=[1, 1])


def test_max_pool_then_unpool():
    x = rand(2, 3, 6, 4)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    nodes = [helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs),
             helper.make_node("MaxUnpool", ["y", "i"], ["u"], **attrs)]
    graph = helper.make_graph(nodes, "g", [value_info("x", x)],
                              [helper.make_value_info("u", onnx.TypeProto())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    (got,) = check_model(model, {"x": x})
    assert got.shape == x.shape


def test_max_unpool_output_shape():
    # ONNX's example: the indices address the inferred 4 x 4, padded to 5 x 5.
    x = np.array([[[[5, 6], [7, 8]]]], np.float32)
    i = np.array([[[[5, 7], [13, 15]]]], np.int64)
    check_node("MaxUnpool", {"x": x, "i": i},
               initializers={"shape": np.array([1, 1, 5, 5], np.int64)},
               kernel_shape=[2, 2], strides=[2, 2])


def test_max_pool_same_lower_odd_padding():
    # The reference evaluator's MaxPool gets SAME_LOWER wrong (floor(in / stride) windows,
    # extra padding at the end); the spec's: ceil(7 / 2) = 4 windows, the extra pad first.
    x = rand(1, 2, 7, 7)
    (got,) = run_mlxprog(node_model("MaxPool", {"x": x}, kernel_shape=[2, 2], strides=[2, 2],
                                    auto_pad="SAME_LOWER"), {"x": x})
    want = ReferenceEvaluator(node_model("MaxPool", {"x": x}, kernel_shape=[2, 2],
                                         strides=[2, 2], pads=[1, 1, 0, 0])).run(None, {"x": x})
    np.testing.assert_array_equal(got, want[0])


@pytest.mark.parametrize("attrs", POOL_CASES + [
    {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "SAME_LOWER"}])
@pytest.mark.parametrize("include", [0, 1])
def test_average_pool(attrs, include):
    check_node("AveragePool", {"x": rand(2, 3, 7, 7)}, count_include_pad=include,
               rtol=1e-5, atol=1e-6, **attrs)


def test_average_pool_1d_3d_dilations():
    check_node("AveragePool", {"x": rand(1, 2, 9)}, kernel_shape=[3], strides=[2],
               pads=[1, 1])
    check_node("AveragePool", {"x": rand(1, 2, 4, 5, 6)}, kernel_shape=[2, 3, 2],
               pads=[1, 1, 0, 0, 1, 1], count_include_pad=1)
    check_node("AveragePool", {"x": rand(1, 2, 8, 8)}, kernel_shape=[2, 2],
               dilations=[2, 2])


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(p):
    check_node("LpPool", {"x": rand(1, 2, 6, 6)}, kernel_shape=[3, 3], strides=[2, 2],
               pads=[1, 1, 1, 1], p=p, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pools(op):
    check_node(op, {"x": rand(2, 3, 5, 4)}, rtol=1e-5, atol=1e-5)
    if op == "GlobalAveragePool":  # the reference's GlobalMaxPool is 2-d only
        check_node(op, {"x": rand(2, 3, 4, 5, 3)}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op,fn", [
    ("GlobalAveragePool", lambda x: x.mean(axis=2, keepdims=True)),
    ("GlobalMaxPool", lambda x: x.max(axis=2, keepdims=True)),  # reference: wrong for 1-d
    ("GlobalLpPool", lambda x: np.sqrt((x * x).sum(axis=2, keepdims=True))),  # no reference
])
def test_global_pools_1d_numpy(op, fn):
    x = rand(2, 3, 5)
    (got,) = run_mlxprog(node_model(op, {"x": x}), {"x": x})
    np.testing.assert_allclose(got, fn(x), rtol=1e-5, atol=1e-6)


def test_global_lp_pool_p3():
    x = rand(2, 3, 4, 2)
    (got,) = run_mlxprog(node_model("GlobalLpPool", {"x": x}, p=3), {"x": x})
    want = (np.abs(x) ** 3).sum(axis=(2, 3), keepdims=True) ** (1 / 3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# -- normalizations --------------------------------------------------------------------------

def test_batch_normalization_constant_and_runtime_stats():
    c = 3
    stats = {"s": rand(c), "bias": rand(c), "mean": rand(c),
             "var": np.abs(rand(c)) + 0.1}
    check_node("BatchNormalization", {"x": rand(2, c, 4, 5)}, initializers=stats,
               epsilon=1e-3, rtol=1e-5, atol=1e-5)
    check_node("BatchNormalization", {"x": rand(2, c, 4, 5), **stats}, rtol=1e-5, atol=1e-5)
    check_node("BatchNormalization", {"x": rand(4, c)}, initializers=stats,
               rtol=1e-5, atol=1e-5)


def test_batch_normalization_training_fails():
    c = 2
    stats = {"s": rand(c), "bias": rand(c), "mean": rand(c), "var": np.abs(rand(c))}
    node = helper.make_node("BatchNormalization", ["x", *stats], ["y"], training_mode=1)
    graph = helper.make_graph([node], "g", [value_info("x", rand(1, c, 2, 2))],
                              [helper.make_value_info("y", onnx.TypeProto())],
                              [numpy_helper.from_array(a, n) for n, a in stats.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    with pytest.raises(OnnxImportError, match="training_mode"):
        import_model(model)


def test_dropout_identity_and_mask():
    x = rand(2, 3)
    check_node("Dropout", {"x": x})
    check_node("Dropout", {"x": x}, outputs=("y", "mask"))
    check_node("Dropout", {"x": x}, initializers={"ratio": np.array(0.5, np.float32),
                                                   "training": np.array(False)})


def test_lrn():
    # The reference evaluator loops its channels over the batch dim: N == C keeps it right.
    check_node("LRN", {"x": rand(5, 5, 3, 3)}, size=3, rtol=1e-5, atol=1e-5)
    check_node("LRN", {"x": rand(4, 4, 2, 3)}, size=4, alpha=0.01, beta=0.5, bias=2.0,
               rtol=1e-5, atol=1e-5)


def test_instance_normalization():
    check_node("InstanceNormalization", {"x": rand(2, 3, 4, 5)},
               initializers={"s": rand(3), "b": rand(3)}, epsilon=1e-3, rtol=1e-4, atol=1e-5)
    check_node("InstanceNormalization", {"x": rand(2, 3, 7), "s": rand(3), "b": rand(3)},
               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("axis", [-1, 1, -2])
def test_layer_normalization(axis):
    shape = (2, 3, 4)
    norm = shape[axis:] if axis < 0 else shape[axis:]
    check_node("LayerNormalization", {"x": rand(*shape)},
               outputs=("y", "mean", "inv"),
               initializers={"s": rand(*norm), "b": rand(*norm)}, axis=axis,
               rtol=1e-4, atol=1e-5)


def test_layer_normalization_no_bias_float16():
    check_node("LayerNormalization", {"x": rand(3, 8, dtype=np.float16)},
               initializers={"s": rand(8, dtype=np.float16)}, rtol=1e-2, atol=1e-2)


def test_group_normalization():
    check_node("GroupNormalization", {"x": rand(2, 6, 3, 3)},
               initializers={"s": rand(6), "b": rand(6)}, num_groups=3, epsilon=1e-3,
               rtol=1e-4, atol=1e-5)
    check_node("GroupNormalization", {"x": rand(2, 4, 5), "s": rand(4), "b": rand(4)},
               num_groups=2, rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("p,axis", [(1, -1), (2, 1), (2, 0)])
def test_lp_normalization(p, axis):
    x = rand(3, 4, 2)
    if p == 1:  # the reference sums x, not |x|
        x = np.abs(x)
    x[0, 0] = 0  # a zero norm (axis -1) gives 0, not NaN
    check_node("LpNormalization", {"x": x}, p=p, axis=axis, rtol=1e-5, atol=1e-6)


def test_mean_variance_normalization():
    check_node("MeanVarianceNormalization", {"x": rand(2, 3, 4, 4)}, rtol=1e-4, atol=1e-5)
    check_node("MeanVarianceNormalization", {"x": rand(2, 3, 4)}, axes=[1, 2],
               rtol=1e-4, atol=1e-5)


# -- layout: the channels-last chain ----------------------------------------------------------

def _chain_model(c=3):
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s", "bias", "mean", "var"], ["bn"]),
        helper.make_node("MaxPool", ["bn"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Dropout", ["mp"], ["d"]),
        helper.make_node("Conv", ["d", "w2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["c2"], ["ap"], kernel_shape=[2, 2]),
        helper.make_node("GlobalAveragePool", ["ap"], ["y"]),
    ]
    inits = {"w1": rand(4, c, 3, 3), "b1": rand(4), "s": rand(4), "bias": rand(4),
             "mean": rand(4), "var": np.abs(rand(4)) + 0.5, "w2": rand(5, 4, 3, 3)}
    graph = helper.make_graph(nodes, "chain", [value_info("x", rand(1, c, 12, 12))],
                              [helper.make_value_info("y", onnx.TypeProto())],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def test_chain_has_no_transpose_between_layers():
    model = _chain_model()
    check_model(model, {"x": rand(1, 3, 12, 12)}, rtol=1e-4, atol=1e-4)
    program, weights = import_model(model)
    ops = [inst.op for inst in program.instructions]
    # one transpose into channels-last at the input, one back at the output
    assert ops.count("transpose") == 2, ops
    assert ops[0] == "transpose" and ops[-1] == "transpose", ops
    # the weights were rearranged at import: no transposes of them in the program
    assert all(w.ndim != 4 or w.shape[-1] in (3, 4) for w in weights.values())


@pytest.mark.parametrize("shape,axis", [((3, 8), -1), ((2, 3, 4), 1), ((2, 3, 4), 0),
                                        ((2, 3, 4, 5), -2), ((2, 3, 4, 5), 3)], ids=str)
def test_rms_normalization(shape, axis):
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, shape).astype(np.float32)
    scale = rng.uniform(0.5, 1.5, shape[axis:]).astype(np.float32)
    inputs = {"x": x, "scale": scale}
    check_model(node_model("RMSNormalization", inputs, opset=23, axis=axis, epsilon=1e-3),
                inputs, 1e-5, 1e-5)


def test_rms_normalization_broadcast_scale_float16():
    rng = np.random.default_rng(2)
    x = rng.uniform(-2, 2, (2, 3, 4)).astype(np.float16)
    scale = rng.uniform(0.5, 1.5, (4,)).astype(np.float16)
    inputs = {"x": x, "scale": scale}
    check_model(node_model("RMSNormalization", inputs, opset=23, axis=1), inputs, 1e-2, 1e-2)


def test_conv_integer_wide_sums_and_qlinear_conv_bad_output_type():
    """A ConvInteger whose sums can pass 2**24 (3*3*64 uint8 products)
    computes in float64, exactly; QLinearConv refuses a non-8-bit output."""
    rng = np.random.default_rng(4)
    x = rng.integers(0, 255, (1, 64, 5, 5), dtype=np.uint8)
    w = rng.integers(0, 255, (2, 64, 3, 3), dtype=np.uint8)
    check_node("ConvInteger", {"x": x}, initializers={"w": w, "xz": np.array(3, np.uint8),
                                                       "wz": np.array(250, np.uint8)},
               rtol=0, atol=0)
    params = {"xs": np.array(0.1, np.float32), "xz": np.array(0, np.uint8), "w": w,
              "ws": np.array(0.2, np.float32), "wz": np.array(0, np.uint8),
              "ys": np.array(0.3, np.float32), "yz": np.array(0, np.int32)}
    with pytest.raises(OnnxImportError, match="y_zero_point is int32"):
        import_model(node_model("QLinearConv", {"x": x}, initializers=params))


def test_causal_conv_with_state_and_bad_activation():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    inputs = {"x": x, "w": rng.standard_normal((3, 1, 4)).astype(np.float32),
              "bias": rng.standard_normal(3).astype(np.float32),
              "past": rng.standard_normal((2, 3, 3)).astype(np.float32)}
    check_model(node_model("CausalConvWithState", inputs, outputs=("y", "state"), opset=27,
                           activation="silu"), inputs)
    with pytest.raises(OnnxImportError, match="activation='gelu'"):
        import_model(node_model("CausalConvWithState", inputs, outputs=("y", "state"),
                                opset=27, activation="gelu"))


def test_deform_conv_groups_and_bad_offset():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 4, 5, 6)).astype(np.float32)
    w = rng.standard_normal((6, 2, 2, 3)).astype(np.float32)
    offset = (rng.standard_normal((1, 2 * 6 * 2, 3, 3)) * 1.5).astype(np.float32)
    mask = rng.uniform(0, 1, (1, 2 * 6, 3, 3)).astype(np.float32)
    inits = {"w": w, "offset": offset, "b": np.arange(6, dtype=np.float32), "mask": mask}
    check_model(node_model("DeformConv", {"x": x}, initializers=inits, opset=22, group=2,
                           offset_group=2, strides=[2, 2], pads=[1, 0, 0, 1]),
                {"x": x}, rtol=1e-4, atol=1e-5)
    with pytest.raises(OnnxImportError, match="offset_group=3"):
        import_model(node_model("DeformConv", {"x": x}, initializers=inits, opset=22,
                                group=2, offset_group=3, strides=[2, 2], pads=[1, 0, 0, 1]))
