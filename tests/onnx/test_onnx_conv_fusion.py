"""A Conv's sum and ReLU fused into it at import (mlxprog/onnx/fold.py's
fuse_conv_epilogue, onnxruntime's FusedConv): the program computes what the
graph does with fewer instructions, only what may fuse is fused, and
FusedConv nodes as onnxruntime's optimizer writes them import too."""

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx_cases import graph_model

import mlxprog as mp
from mlxprog.onnx import import_model
from mlxprog.onnx.fold import CONTRIB_DOMAIN, fuse_conv_epilogue
from mlxprog.onnx.importer import inferred_shapes, load_model

RNG = np.random.default_rng(5)
F = TensorProto.FLOAT


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def conv(x: str, out: str, name: str, channels_in: int, channels: int, inits: list,
         bias: bool = True, **attrs) -> onnx.NodeProto:
    """A 3x3 same-padded Conv node ``name`` (its weights appended to ``inits``)."""
    inits.append((f"{name}.w", rand(channels, channels_in // attrs.get("group", 1),
                                    *[3] * attrs.pop("spatial", 2))))
    inputs = [x, f"{name}.w"]
    if bias:
        inits.append((f"{name}.b", rand(channels)))
        inputs.append(f"{name}.b")
    pads = len(inits[-1 - bias][1].shape) - 2
    return helper.make_node("Conv", inputs, [out], name=name, pads=[1] * (2 * pads), **attrs)


def run(model: onnx.ModelProto, inputs: dict) -> tuple[list[np.ndarray], mp.Program]:
    program, weights = import_model(model)
    outputs = mp.compile(program, captures=dict(weights))(**inputs)
    return [np.array(o) for o in outputs], program


def check(model: onnx.ModelProto, inputs: dict, reference: onnx.ModelProto | None = None
          ) -> tuple[mp.Program, Counter]:
    """The model's outputs equal the reference evaluator's on ``reference``
    (default: the model); its program and op counts."""
    got, program = run(model, inputs)
    want = ReferenceEvaluator(reference or model).run(None, inputs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    return program, Counter(i.op for i in program.instructions)


def fused_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    converted = load_model(model)
    fused = fuse_conv_epilogue(converted, inferred_shapes(converted))
    return [n for n in fused.graph.node if n.op_type == "FusedConv"]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_conv_relu_becomes_one_conv(bias):
    inits = []
    nodes = [conv("x", "c", "conv", 4, 8, inits, bias=bias),
             helper.make_node("Relu", ["c"], ["y"])]
    model = graph_model(nodes, [("x", F, [1, 4, 7, 6])], ["y"], inits)
    program, ops = check(model, {"x": rand(1, 4, 7, 6)})
    assert ops["max"] == 0 and ops["add"] == 0 and ops["conv_general"] == 1
    (step,) = [i for i in program.instructions if i.op == "conv_general"]
    assert step.attrs["activation"] == "relu"
    assert [n.name for n in fused_nodes(model)] == ["conv"]


@pytest.mark.parametrize("relu", [True, False], ids=["add_relu", "add"])
@pytest.mark.parametrize("sum_op", ["Add", "Sum"])
def test_residual_block_sum_fuses_into_the_conv(relu, sum_op):
    """``relu(conv2(relu(conv1(x))) + shortcut(x))``, the shortcut a Conv
    written after the main branch: the Add's other input is computed after
    the Conv that takes it as Z, so the fused node sits where the Add was."""
    inits = []
    nodes = [conv("x", "a", "conv1", 8, 8, inits), helper.make_node("Relu", ["a"], ["r"]),
             conv("r", "m", "conv2", 8, 8, inits), conv("x", "s", "shortcut", 8, 8, inits),
             helper.make_node(sum_op, ["m", "s"], ["sum"])]
    if relu:
        nodes.append(helper.make_node("Relu", ["sum"], ["y"]))
    model = graph_model(nodes, [("x", F, [2, 8, 6, 5])], ["y" if relu else "sum"], inits)
    program, ops = check(model, {"x": rand(2, 8, 6, 5)})
    assert ops["add"] == 0 and ops["max"] == 0 and ops["conv_general"] == 3
    convs = [i for i in program.instructions if i.op == "conv_general"]
    assert sorted(len(i.operands) for i in convs) == [3, 3, 4]  # conv2 takes the shortcut
    names = sorted(n.name for n in fused_nodes(model))
    assert names == ["conv1", "conv2"]


def test_sum_needing_broadcast_is_not_fused():
    """A sum input that broadcasts (per channel, not of the output's shape)
    stays an Add: the kernel's residual is element by element."""
    inits = []
    nodes = [conv("x", "c", "conv", 4, 6, inits), helper.make_node("Add", ["c", "z"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    model = graph_model(nodes, [("x", F, [1, 4, 5, 5]), ("z", F, [1, 6, 1, 1])], ["y"], inits)
    _, ops = check(model, {"x": rand(1, 4, 5, 5), "z": rand(1, 6, 1, 1)})
    assert ops["add"] == 1
    assert fused_nodes(model) == []


def test_other_readers_block_fusion():
    inits = []
    nodes = [conv("x", "c", "conv", 4, 6, inits), helper.make_node("Relu", ["c"], ["y"]),
             helper.make_node("Sigmoid", ["c"], ["y2"])]
    model = graph_model(nodes, [("x", F, [1, 4, 5, 5])], ["y", "y2"], inits)
    _, ops = check(model, {"x": rand(1, 4, 5, 5)})
    assert ops["max"] == 1
    assert fused_nodes(model) == []
    # A conv output that is also a graph output stays written.
    nodes = [conv("x", "c", "conv", 4, 6, []), helper.make_node("Relu", ["c"], ["y"])]
    assert fused_nodes(graph_model(nodes, [("x", F, [1, 4, 5, 5])], ["y", "c"], inits)) == []


def test_grouped_3d_conv_adds_after():
    """A grouped 3-d Conv runs as one conv_general per group: its sum and
    ReLU are added after them, with the same values."""
    inits = []
    nodes = [conv("x", "c", "conv", 4, 4, inits, group=2, spatial=3),
             helper.make_node("Add", ["c", "z"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    shape = [1, 4, 3, 4, 3]
    model = graph_model(nodes, [("x", F, shape), ("z", F, shape)], ["y"], inits)
    check(model, {"x": rand(*shape), "z": rand(*shape)})
    assert len(fused_nodes(model)) == 1


def ort_fused_model(activation: str | None, params: list[float], with_sum: bool
                    ) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """A model of one FusedConv as onnxruntime's optimizer writes it, and the
    plain graph it stands for (Conv, Add, the activation)."""
    w, b = rand(6, 3, 3, 3), rand(6)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    inputs = [helper.make_tensor_value_info("x", F, [1, 3, 6, 6])]
    if with_sum:
        inputs.append(helper.make_tensor_value_info("z", F, [1, 6, 6, 6]))
    attrs = {"activation": activation} if activation else {}
    if params:
        attrs["activation_params"] = params
    fused = helper.make_node("FusedConv", ["x", "w", "b", *(["z"] if with_sum else [])], ["y"],
                             domain=CONTRIB_DOMAIN, pads=[1, 1, 1, 1], name="fused", **attrs)
    plain = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])]
    last = "c"
    if with_sum:
        plain.append(helper.make_node("Add", ["c", "z"], ["s"]))
        last = "s"
    if activation == "Clip":
        inits_plain = [numpy_helper.from_array(np.float32(v), n) for v, n in zip(params, "lh")]
        plain.append(helper.make_node("Clip", [last, "l", "h"], ["y"]))
    else:
        inits_plain = []
        names = {"LeakyRelu": ["alpha"], "HardSigmoid": ["alpha", "beta"]}.get(activation, [])
        plain.append(helper.make_node(activation or "Identity", [last], ["y"],
                                      **dict(zip(names, params))))
    out = [helper.make_tensor_value_info("y", F, None)]
    model = helper.make_model(helper.make_graph([fused], "g", inputs, out, inits),
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid(CONTRIB_DOMAIN, 1)])
    reference = helper.make_model(helper.make_graph(plain, "g", inputs, out,
                                                    [*inits, *inits_plain]),
                                  opset_imports=[helper.make_opsetid("", 17)])
    return model, reference


@pytest.mark.parametrize("activation, params", [
    (None, []), ("Relu", []), ("Tanh", []), ("Sigmoid", []), ("LeakyRelu", [0.2]),
    ("Clip", [-0.5, 1.5]), ("HardSigmoid", [0.3, 0.4])])
@pytest.mark.parametrize("with_sum", [False, True], ids=["conv", "conv+sum"])
def test_onnxruntime_fused_conv_imports(activation, params, with_sum):
    model, reference = ort_fused_model(activation, params, with_sum)
    inputs = {"x": rand(1, 3, 6, 6)}
    if with_sum:
        inputs["z"] = rand(1, 6, 6, 6)
    check(model, inputs, reference)


@pytest.mark.parametrize("activation, params, message", [
    ("Softplus", [], r"activation 'Softplus' is not one of Relu"),
    ("LeakyRelu", [], r"activation LeakyRelu takes 1 activation_params; found 0"),
])
def test_bad_fused_conv_is_an_error_naming_the_node(activation, params, message):
    model, _ = ort_fused_model(activation, params, False)
    with pytest.raises(mp.ProgramError, match=rf"node 0 'fused' \(FusedConv\): {message}"):
        import_model(model)


def test_fused_conv_sum_of_another_shape_is_an_error():
    model, _ = ort_fused_model("Relu", [], True)
    model.graph.input[1].CopyFrom(helper.make_tensor_value_info("z", F, [1, 6, 3, 3]))
    with pytest.raises(mp.ProgramError, match=r"node 0 'fused' \(FusedConv\): the sum input Z "
                                              r"must have the output's shape.*\[1, 6, 6, 6\]"):
        import_model(model)
