"""The importer: symbolic shape computations folded at import, graph inputs
and initializers, layouts, unsupported ops, bad files, old opsets."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_cases import OPSET, check_model, i64, node_model, run_mlxprog

from mlxprog.onnx import ChannelsLast, OnnxImportError, import_model
from mlxprog.onnx import registry
from mlxprog.onnx import UnsupportedOpsError


def tensor(name, dtype=TensorProto.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, dtype, shape)


def model(nodes, inputs, outputs, initializers=None, opset=OPSET):
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "case", inputs, [tensor(o, 0) for o in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def node(op_type, inputs, outputs, **attrs):
    return helper.make_node(op_type, inputs, outputs, **attrs)


def ops(program):
    return [inst.op for inst in program.instructions]


# -- symbolic shape computations ------------------------------------------------


def test_torch_flatten_of_a_symbolic_batch_folds_to_one_reshape():
    # torch.flatten(x, 1) as exported with a dynamic batch:
    # Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])).
    m = model([node("Shape", ["x"], ["s"]),
               node("Gather", ["s", "zero"], ["n"], axis=0),
               node("Unsqueeze", ["n", "axes0"], ["n1"]),
               node("Concat", ["n1", "minus1"], ["shape"], axis=0),
               node("Reshape", ["x", "shape"], ["y"])],
              [tensor("x", shape=["batch", 2, 3, 4])], ["y"],
              {"zero": np.int64(0), "axes0": i64(0), "minus1": i64(-1)})
    program, _ = import_model(m)
    assert ops(program) == ["reshape"]
    assert program.instructions[0].attrs["shape"] == ["batch", -1]
    for batch in (1, 3):
        check_model(m, {"x": np.random.rand(batch, 2, 3, 4).astype(np.float32)})


def test_shape_arithmetic_becomes_dim_expressions():
    # [N*3*4] from Shape -> Slice -> ReduceProd-free arithmetic: Mul of gathered dims;
    # then (N*12) / 4 back to [N*3, 4] through Div and Sub on shape values.
    m = model([node("Shape", ["x"], ["s"]),
               node("Slice", ["s", "zero1", "one1"], ["n1"]),
               node("Mul", ["n1", "twelve"], ["flat"]),
               node("Reshape", ["x", "flat"], ["y"]),
               node("Shape", ["y"], ["sy"]),
               node("Div", ["sy", "four"], ["rows"]),
               node("Sub", ["five", "one1"], ["cols"]),
               node("Concat", ["rows", "cols"], ["shape"], axis=0),
               node("Reshape", ["y", "shape"], ["z"])],
              [tensor("x", shape=["N", 3, 4])], ["y", "z"],
              {"zero1": i64(0), "one1": i64(1), "twelve": i64(12), "four": i64(4),
               "five": i64(5)})
    program, _ = import_model(m)
    assert [i.attrs["shape"] for i in program.instructions] == [["12*N"], ["3*N", 4]]
    check_model(m, {"x": np.random.rand(5, 3, 4).astype(np.float32)})


def test_sizes_made_of_several_dims_are_solved():
    # Reshape [B, T, 4] to [-1, 4]: ONNX's shape inference cannot name B*T;
    # the importer solves it from other bindings of B and T.
    m = model([node("Reshape", ["x", "rows4"], ["y"]),
               node("Shape", ["y"], ["s"]),
               node("Gather", ["s", "first"], ["n"], axis=0),
               node("Concat", ["n", "two2"], ["shape"], axis=0),
               node("Reshape", ["y", "shape"], ["z"])],
              [tensor("x", shape=["B", "T", 4])], ["z"],
              {"rows4": i64(-1, 4), "first": i64(0), "two2": i64(2, 2)})
    program, _ = import_model(m)
    assert program.instructions[-1].attrs["shape"] == ["B*T", 2, 2]
    check_model(m, {"x": np.random.rand(2, 3, 4).astype(np.float32)})


def test_reduce_prod_of_a_shape_value_multiplies_dims():
    # flatten(x, 1) as Reshape(x, Concat(s[:1], ReduceProd(s[1:]))).
    m = model([node("Shape", ["x"], ["s"]),
               node("Slice", ["s", "one1", "big"], ["tail"]),
               node("ReduceProd", ["tail"], ["p"], keepdims=1),
               node("Slice", ["s", "zero1", "one1"], ["head"]),
               node("Concat", ["head", "p"], ["shape"], axis=0),
               node("Reshape", ["x", "shape"], ["y"])],
              [tensor("x", shape=["N", "T", 3])], ["y"],
              {"zero1": i64(0), "one1": i64(1), "big": i64(100)})
    program, _ = import_model(m)
    assert program.instructions[-1].attrs["shape"] == ["N", "3*T"]
    check_model(m, {"x": np.random.rand(2, 5, 3).astype(np.float32)})


def test_upsample_size_arithmetic_with_casts_floor_and_max():
    # out = max(floor(float(N) * 2.0), 1) rows: Cast, Mul by a float, Floor,
    # Cast back, Max against 1 (a dim is at least 1), Neg twice.
    m = model([node("Shape", ["x"], ["s"]),
               node("Slice", ["s", "zero1", "one1"], ["n"]),
               node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
               node("Mul", ["nf", "two_f"], ["scaled"]),
               node("Floor", ["scaled"], ["floored"]),
               node("Cast", ["floored"], ["rows"], to=TensorProto.INT64),
               node("Max", ["rows", "one1"], ["clamped"]),
               node("Neg", ["clamped"], ["neg"]), node("Neg", ["neg"], ["pos"]),
               node("Concat", ["pos", "minus1"], ["shape"], axis=0),
               node("Reshape", ["x", "shape"], ["y"])],
              [tensor("x", shape=["N", 4])], ["y"],
              {"zero1": i64(0), "one1": i64(1), "two_f": np.float32(2.0), "minus1": i64(-1)})
    program, _ = import_model(m)
    assert program.instructions[-1].attrs["shape"] == ["2*N", -1]
    check_model(m, {"x": np.random.rand(3, 4).astype(np.float32)})


def test_torch_expand_pattern_compares_dims_with_minus_one():
    # x.expand(N, 4) as torch exports it: ConstantOfShape(Shape(shape)) * -1,
    # Equal(shape, that), Where(..., ones, shape) into Expand.
    m = model([node("Shape", ["x"], ["s"]),
               node("Gather", ["s", "zero1"], ["n"], axis=0),
               node("Concat", ["n", "four"], ["shape"], axis=0),
               node("Shape", ["shape"], ["rank"]),
               node("ConstantOfShape", ["rank"], ["ones"], value=numpy_helper.from_array(i64(1))),
               node("Mul", ["ones", "minus1"], ["neg"]),
               node("Equal", ["shape", "neg"], ["is_neg"]),
               node("Where", ["is_neg", "ones", "shape"], ["target"]),
               node("Expand", ["x", "target"], ["y"])],
              [tensor("x", shape=["N", 1])], ["y"],
              {"zero1": i64(0), "four": i64(4), "minus1": np.int64(-1)})
    program, _ = import_model(m)
    assert ops(program) == ["broadcast_to"]
    check_model(m, {"x": np.random.rand(3, 1).astype(np.float32)})


def test_shape_of_a_run_time_value_with_a_static_shape_is_numeric():
    # 'h' is computed at run time, its shape [2, 6] is static: it folds to
    # int64 numbers, which the reference evaluator folds further (Add).
    m = model([node("Relu", ["w"], ["h"]), node("Shape", ["h"], ["s"]),
               node("Add", ["s", "zero2"], ["shape"]), node("Reshape", ["x", "shape"], ["y"])],
              [tensor("x", shape=[3, 4]), tensor("w", shape=[2, 6])], ["y"],
              {"zero2": i64(0, 0)})
    program, _ = import_model(m)
    assert program.instructions[-1].attrs["shape"] == [2, 6]
    check_model(m, {"x": np.random.rand(3, 4).astype(np.float32),
                    "w": np.random.rand(2, 6).astype(np.float32)})


def test_a_static_size_equal_to_a_dims_sample_is_no_dim():
    # While building, dim N is inferred at size 7: the static 7 of axis 1 must
    # stay 7 (ONNX's shape inference says so), not become N.
    m = model([node("Relu", ["x"], ["h"]), node("Shape", ["h"], ["s"]),
               node("Gather", ["s", "order"], ["swapped"], axis=0),
               node("Reshape", ["h", "swapped"], ["y"])],
              [tensor("x", shape=["N", 7])], ["y"], {"order": i64(1, 0)})
    program, _ = import_model(m)
    assert program.instructions[-1].attrs["shape"] == [7, "N"]
    check_model(m, {"x": np.random.rand(3, 7).astype(np.float32)})


def test_a_shape_input_computed_at_run_time_is_an_error_naming_it():
    m = node_model("Reshape", {"x": np.zeros((2, 3), np.float32), "shape": i64(3, 2)})
    with pytest.raises(OnnxImportError, match=r"node 0 \(Reshape\): input 1 \(shape, 'shape'\) "
                                              "must be known at import"):
        import_model(m)


def test_a_shape_value_used_as_data_is_computed_at_run_time():
    # Shape(x) with a symbolic dim read by an ordinary op (Add of floats), and
    # returned as an output: computed per call, in ONNX's types.
    m = model([node("Shape", ["x"], ["s"]), node("Cast", ["s"], ["f"], to=TensorProto.FLOAT),
               node("Add", ["f", "v"], ["y"]),
               node("Slice", ["s", "zero1", "one1"], ["n"]), node("Mul", ["n", "three"], ["n3"])],
              [tensor("x", shape=["N", 2]), tensor("v", shape=[2])], ["y", "s", "n3"],
              {"zero1": i64(0), "one1": i64(1), "three": i64(3)})
    for batch in (1, 4):
        y, s, n3 = check_model(m, {"x": np.zeros((batch, 2), np.float32),
                                   "v": np.array([0.5, 1.0], np.float32)})
        assert s.tolist() == [batch, 2] and n3.tolist() == [3 * batch]


# -- inputs and initializers ------------------------------------------------------


def test_an_initializer_listed_as_a_graph_input_is_no_program_input():
    # ONNX lets a graph input have a default: an initializer of the same name.
    w = np.array([1.0, 2.0, 3.0], np.float32)
    m = model([node("Mul", ["x", "w"], ["y"])], [tensor("x", shape=[3]), tensor("w", shape=[3])],
              ["y"], {"w": w})
    program, weights = import_model(m)
    assert [s.name for s in program.inputs] == ["x"]
    assert [s.name for s in program.captures] == ["w"]
    x = np.array([2.0, 2.0, 2.0], np.float32)
    (y,) = run_mlxprog(m, {"x": x})
    np.testing.assert_array_equal(y, x * w)


def test_an_old_opset_is_converted_first():
    # Opset 9's Unsqueeze takes its axes as an attribute (an input since 13).
    m = model([node("Unsqueeze", ["x"], ["u"], axes=[0]), node("Relu", ["u"], ["y"])],
              [tensor("x", shape=[2, 3])], ["y"], opset=9)
    (y,) = check_model(m, {"x": np.random.randn(2, 3).astype(np.float32)})
    assert y.shape == (1, 2, 3)


def test_an_old_opset_whose_conversion_changes_the_inputs_is_an_error():
    # onnx.version_converter drops opset 8 Scan's batch axis from the inputs.
    body = helper.make_graph([node("Add", ["s", "x_t"], ["s_out"]),
                              node("Identity", ["s_out"], ["y_t"])], "body",
                             [tensor("s", shape=[2]), tensor("x_t", shape=[2])],
                             [tensor("s_out", shape=[2]), tensor("y_t", shape=[2])])
    graph = helper.make_graph(
        [node("Scan", ["", "s0", "x"], ["s", "ys"], num_scan_inputs=1, body=body)], "scan8",
        [tensor("s0", shape=[1, 2]), tensor("x", shape=[1, 3, 2])],
        [tensor("s", shape=[1, 2]), tensor("ys", shape=[1, 3, 2])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])
    with pytest.raises(OnnxImportError, match="opset 8 .* changes the type or shape of its "
                                              "inputs or outputs 's0', 'x'"):
        import_model(m)


# -- errors ---------------------------------------------------------------------------


def test_unsupported_ops_are_listed_at_once_with_counts_and_nodes():
    body = helper.make_graph([node("TfIdfVectorizer", ["x"], ["t"], name="inner")], "body", [],
                             [tensor("t", 0)])
    m = model([node("StringNormalizer", ["x"], ["a"], name="n1"),
               node("StringNormalizer", ["a"], ["b"]),
               node("If", ["c"], ["y"], name="branch", then_branch=body, else_branch=body)],
              [tensor("x", TensorProto.STRING, [2]), tensor("c", TensorProto.BOOL, [])], ["y"])
    with pytest.raises(UnsupportedOpsError) as info:
        import_model(m)
    found = {key: sorted(names) for key, names in info.value.ops.items()}
    assert found == {
        ("StringNormalizer", "ai.onnx"): ["#1", "n1"],
        ("TfIdfVectorizer", "ai.onnx"): ["branch/else_branch/inner", "branch/then_branch/inner"]}
    assert "StringNormalizer (ai.onnx) x2: n1, #1" in str(info.value)


def test_a_bad_file_is_an_error(tmp_path):
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\x08\x07garbage" * 5)
    with pytest.raises(OnnxImportError, match="cannot read ONNX model"):
        import_model(path)
    with pytest.raises(OnnxImportError, match="not found"):
        import_model(tmp_path / "missing.onnx")


# -- layouts -------------------------------------------------------------------------


@pytest.fixture
def layout_ops(monkeypatch):
    """Two test ops of a private domain: ToNHWC holds its input channels-last;
    ReadNHWC reads its input channels-last (as a convolution does) and
    returns it channels-last again, after adding 1."""
    def to_nhwc(ctx):
        return [ChannelsLast(ctx.input_channels_last(0))]

    def read_nhwc(ctx):
        return [ChannelsLast(ctx.b.add(ctx.input_channels_last(0), 1.0))]

    for op_type, fn in (("ToNHWC", to_nhwc), ("ReadNHWC", read_nhwc)):
        monkeypatch.setitem(registry.CONVERTERS, ("test.layout", op_type),
                            registry.ConverterSpec(op_type, "test.layout", fn))


def test_channels_last_values_pass_between_converters_and_outputs_are_onnx_layout(layout_ops):
    nodes = [helper.make_node("ToNHWC", ["x"], ["a"], domain="test.layout"),
             helper.make_node("ReadNHWC", ["a"], ["b"], domain="test.layout"),
             node("Softmax", ["b"], ["r1"], axis=1), node("Flatten", ["b"], ["r2"])]
    graph = helper.make_graph(nodes, "layout", [tensor("x", shape=["N", 2, 3, 4])],
                              [tensor(n, 0) for n in ("b", "r1", "r2")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                helper.make_opsetid("test.layout", 1)])
    program, _ = import_model(m)
    # One transpose in (ToNHWC), none between the two layout ops, and one
    # back for all three readers of 'b' (Softmax, Flatten, the graph output).
    assert ops(program).count("transpose") == 2
    x = np.random.randn(2, 2, 3, 4).astype(np.float32)
    b, r1, r2 = run_mlxprog(m, {"x": x})
    np.testing.assert_allclose(b, x + 1)
    e = np.exp(x + 1 - (x + 1).max(axis=1, keepdims=True))
    np.testing.assert_allclose(r1, e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(r2, (x + 1).reshape(2, -1))


def test_elementwise_ops_and_channel_concat_keep_the_channels_last_layout(layout_ops):
    # Conv -> Relu -> Add (residual) -> Mul by a scalar -> Concat of channels
    # -> Conv, as in ResNet/DenseNet blocks: no transpose between them.
    nodes = [helper.make_node("ToNHWC", ["x"], ["a"], domain="test.layout"),
             node("Relu", ["a"], ["r"]), node("Add", ["r", "a"], ["s"]),
             node("Mul", ["s", "two"], ["m"]), node("Concat", ["m", "a"], ["c"], axis=1),
             helper.make_node("ReadNHWC", ["c"], ["y"], domain="test.layout")]
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    graph = helper.make_graph(nodes, "layout", [tensor("x", shape=["N", 2, 3, 4])],
                              [tensor("y", 0)], [two])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                helper.make_opsetid("test.layout", 1)])
    program, _ = import_model(m)
    assert ops(program).count("transpose") == 2  # in, and back at the output
    x = np.random.randn(2, 2, 3, 4).astype(np.float32)
    (y,) = run_mlxprog(m, {"x": x})
    np.testing.assert_allclose(y, np.concatenate([2 * (np.maximum(x, 0) + x), x], axis=1) + 1,
                               rtol=1e-6)


def test_per_channel_constants_keep_the_channels_last_layout(layout_ops):
    # Caffe2-style scale and bias layers after a convolution: Mul and Add by
    # [C, 1, 1] constants, computed on the channels-last tensor as [C].
    nodes = [helper.make_node("ToNHWC", ["x"], ["a"], domain="test.layout"),
             node("Mul", ["a", "scale"], ["m"]), node("Add", ["bias", "m"], ["s"]),
             helper.make_node("ReadNHWC", ["s"], ["y"], domain="test.layout")]
    scale = np.array([2.0, -1.0], np.float32).reshape(2, 1, 1)
    bias = np.array([0.5, 3.0], np.float32).reshape(1, 2, 1, 1)
    graph = helper.make_graph(nodes, "layout", [tensor("x", shape=["N", 2, 3, 4])],
                              [tensor("y", 0)], [numpy_helper.from_array(scale, "scale"),
                                                 numpy_helper.from_array(bias, "bias")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                helper.make_opsetid("test.layout", 1)])
    program, _ = import_model(m)
    assert ops(program).count("transpose") == 2
    x = np.random.randn(2, 2, 3, 4).astype(np.float32)
    (y,) = run_mlxprog(m, {"x": x})
    np.testing.assert_allclose(y, bias + x * scale + 1, rtol=1e-6)


# -- what a converter declares -------------------------------------------------------


def test_an_op_declared_not_folded_is_converted_even_on_constants(monkeypatch):
    """``folded=False`` (what a random op would declare) keeps a node whose
    inputs are all known at import out of the importer's folding and out of
    the Conv + affine pre-pass: both read the trait from the registry."""
    import dataclasses

    from mlxprog.onnx.fold import fold_conv_affine

    w = np.random.default_rng(0).standard_normal((2, 2, 3)).astype(np.float32)
    m = model([node("Relu", ["w"], ["rw"]), node("Conv", ["x", "rw"], ["c"], pads=[1, 1]),
               node("Mul", ["c", "s"], ["y"])],
              [tensor("x", shape=[1, 2, 5])], ["y"],
              {"w": w, "s": np.array(2.0, np.float32)})
    program, _ = import_model(m, fold_batch_norm=False)
    assert "max" not in ops(program)  # Relu of a constant: computed at import
    assert len(fold_conv_affine(m).graph.node) == 1  # the Relu, then the Mul, folded away

    relu = registry.find("Relu")
    monkeypatch.setitem(registry.CONVERTERS, ("", "Relu"),
                        dataclasses.replace(relu, folded=False))
    program, _ = import_model(m, fold_batch_norm=False)
    assert "max" in ops(program)
    assert fold_conv_affine(m) is m  # the weight is not known without the Relu
    x = np.random.default_rng(1).standard_normal((1, 2, 5)).astype(np.float32)
    check_model(m, {"x": x})
