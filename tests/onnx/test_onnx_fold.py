"""Conv + BatchNormalization / per-channel Mul and Add folding at import
(mlxprog/onnx/fold.py): the folded program computes what the unfolded one
does, with fewer instructions, and only what may fold is folded."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx_cases import graph_model

import mlxprog as mp
from mlxprog.onnx import import_model
from mlxprog.onnx.fold import fold_conv_affine
from mlxprog.onnx.importer import load_model

RNG = np.random.default_rng(0)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def batch_norm_params(channels: int, prefix: str = "bn") -> list[tuple[str, np.ndarray]]:
    """Non-trivial BN parameters: gamma, beta, mean and a positive variance."""
    return [(f"{prefix}.gamma", rand(channels)), (f"{prefix}.beta", rand(channels)),
            (f"{prefix}.mean", rand(channels)),
            (f"{prefix}.var", RNG.uniform(0.1, 3.0, channels).astype(np.float32))]


def conv_model(followers, x_shape, channels: int, *, bias: bool, group: int = 1,
               extra=(), outputs=("y",), opset: int = 21) -> onnx.ModelProto:
    """``x -> Conv -> followers`` (the Conv writes ``c``); ``extra``:
    more initializers for the followers."""
    n = len(x_shape) - 2
    inits = [("w", rand(channels, x_shape[1] // group, *[3] * n))]
    if bias:
        inits.append(("b", rand(channels)))
    conv = helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["c"], name="conv",
                            group=group, pads=[1] * (2 * n))
    return graph_model([conv, *followers], [("x", TensorProto.FLOAT, list(x_shape))],
                       list(outputs), [*inits, *extra], opset)


def run(model: onnx.ModelProto, x: np.ndarray, fold: bool) -> tuple[list[np.ndarray], mp.Program]:
    """The model imported (folding or not) and run on ``x``: outputs and program."""
    program, weights = import_model(model, fold_batch_norm=fold)
    outputs = mp.compile(program, captures=dict(weights))(x=x)
    return [np.array(o) for o in outputs], program


def check_folds(model: onnx.ModelProto, x: np.ndarray, folded_ops: int,
                reference: bool = True) -> mp.Program:
    """Folded and unfolded imports agree (and, with ``reference``, with ONNX's
    reference evaluator), and folding removes ``folded_ops`` nodes of the
    model as the importer converts it; the folded program."""
    converted = load_model(model)
    assert len(converted.graph.node) - len(fold_conv_affine(converted).graph.node) == folded_ops
    (plain,), unfolded_program = run(model, x, fold=False)
    (folded,), program = run(model, x, fold=True)
    np.testing.assert_allclose(folded, plain, rtol=1e-5, atol=1e-5)
    if reference:
        (want,) = ReferenceEvaluator(model).run(None, {"x": x})
        np.testing.assert_allclose(folded, want, rtol=1e-4, atol=1e-4)
    assert len(program.instructions) < len(unfolded_program.instructions)
    return program


@pytest.mark.parametrize("x_shape", [(2, 4, 9), (1, 4, 6, 7), (1, 4, 4, 5, 3)],
                         ids=["1d", "2d", "3d"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("group", [1, 2])
def test_batch_norm_folds_into_conv(x_shape, bias, group):
    params = batch_norm_params(6)
    bn = helper.make_node("BatchNormalization", ["c", *(n for n, _ in params)], ["y"],
                          epsilon=1e-3)
    model = conv_model([bn], x_shape, 6, bias=bias, group=group, extra=params)
    program = check_folds(model, rand(*x_shape), folded_ops=1)
    ops = [i.op for i in program.instructions]
    assert "multiply" not in ops and "rsqrt" not in ops
    # The folded weight and bias replace the originals, under derived names.
    inits = {i.name for i in fold_conv_affine(model).graph.initializer}
    assert inits == {"w.affine", "b.affine" if bias else "w.affine_bias"}


def test_mul_and_add_of_per_channel_constants_fold():
    """Caffe2-style scale and bias layers ([1, C, 1, 1], [C, 1, 1]) and a
    scalar Mul, chained after the BN, all fold into the one Conv."""
    params = batch_norm_params(4)
    nodes = [helper.make_node("BatchNormalization", ["c", *(n for n, _ in params)], ["n"]),
             helper.make_node("Mul", ["s", "n"], ["m"]),
             helper.make_node("Add", ["m", "t"], ["a"]),
             helper.make_node("Mul", ["a", "half"], ["y"])]
    extra = [*params, ("s", rand(1, 4, 1, 1)), ("t", rand(4, 1, 1)),
             ("half", np.array(0.5, np.float32))]
    model = conv_model(nodes, (1, 3, 5, 5), 4, bias=True, extra=extra)
    program = check_folds(model, rand(1, 3, 5, 5), folded_ops=4)
    assert "multiply" not in [i.op for i in program.instructions]


def test_constant_node_weights_fold_and_are_dropped():
    """Weights from Constant / ConstantOfShape nodes (as in the light models)
    count as constants; the nodes computing them go with the originals."""
    nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(rand(4, 2, 3))),
             helper.make_node("ConstantOfShape", ["scale_shape"], ["s"],
                              value=numpy_helper.from_array(np.array([1.5], np.float32))),
             helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1]),
             helper.make_node("Mul", ["c", "s"], ["y"])]
    model = graph_model(nodes, [("x", TensorProto.FLOAT, [1, 2, 6])], ["y"],
                        [("scale_shape", np.array([4, 1], np.int64))])
    folded = fold_conv_affine(model)
    assert [n.op_type for n in folded.graph.node] == ["Conv"]
    # Scaled only, the bias-free Conv stays bias-free.
    assert [i.name for i in folded.graph.initializer] == ["w.affine"]
    check_folds(model, rand(1, 2, 6), folded_ops=3)


def test_second_consumer_blocks_folding():
    params = batch_norm_params(4)
    bn = helper.make_node("BatchNormalization", ["c", *(n for n, _ in params)], ["y"])
    relu = helper.make_node("Relu", ["c"], ["r"])
    # A subgraph reading the conv output counts too.
    branch = helper.make_graph([helper.make_node("Identity", ["c"], ["t"])], "branch", [],
                               [helper.make_value_info("t", onnx.TypeProto())])
    read_in_if = helper.make_node("If", ["cond"], ["r"], then_branch=branch, else_branch=branch)
    for followers, outputs in (([bn, relu], ("y", "r")), ([bn], ("y", "c")),
                               ([bn, read_in_if], ("y", "r"))):
        model = conv_model(followers, (1, 3, 5, 5), 4, bias=True, outputs=outputs,
                           extra=[*params, ("cond", np.array(True))])
        assert fold_conv_affine(model) is model
    # A Mul reading the conv output twice is not affine in it.
    square = helper.make_node("Mul", ["c", "c"], ["y"])
    model = conv_model([square], (1, 3, 5, 5), 4, bias=True)
    assert fold_conv_affine(model) is model


def test_what_does_not_fold():
    """Training-mode BN, a spatial=0 BN (opset 8), a Mul varying along a
    spatial axis, a Mul by a computed value and a Conv with a weight given
    at run time are left as they are."""
    params = batch_norm_params(4)
    names = [n for n, _ in params]
    cases = [
        conv_model([helper.make_node("BatchNormalization", ["c", *names], ["y"],
                                     training_mode=1)], (1, 3, 5, 5), 4, bias=True, extra=params),
        conv_model([helper.make_node("BatchNormalization", ["c", *names], ["y"], spatial=0)],
                   (1, 3, 5, 5), 4, bias=True, extra=params, opset=8),
        conv_model([helper.make_node("Mul", ["c", "s"], ["y"])], (1, 3, 5, 5), 4, bias=True,
                   extra=[("s", rand(1, 1, 1, 5))]),
        conv_model([helper.make_node("Mul", ["c", "x"], ["y"])], (1, 4, 5, 5), 4, bias=True),
    ]
    for model in cases:
        assert fold_conv_affine(model) is model
    conv = helper.make_node("Conv", ["x", "w"], ["c"])
    bn = helper.make_node("BatchNormalization", ["c", *names], ["y"])
    model = graph_model([conv, bn], [("x", TensorProto.FLOAT, [1, 3, 5, 5]),
                                     ("w", TensorProto.FLOAT, [4, 3, 1, 1])], ["y"], params)
    assert fold_conv_affine(model) is model


def test_old_opset_batch_norm_folds_after_conversion():
    """An opset-7 BN (``spatial`` defaulting to 1) folds once the model is
    converted to the importer's opset; an IR-3 model keeps its new
    initializers listed as graph inputs, as IR 3 requires."""
    params = batch_norm_params(4)
    bn = helper.make_node("BatchNormalization", ["c", *(n for n, _ in params)], ["y"])
    model = conv_model([bn], (1, 3, 5, 5), 4, bias=True, extra=params, opset=7)
    model.ir_version = 3
    model.graph.input.extend(helper.make_tensor_value_info(i.name, i.data_type, i.dims)
                             for i in model.graph.initializer)
    folded = fold_conv_affine(load_model(model))
    onnx.checker.check_model(folded)
    assert [n.op_type for n in folded.graph.node] == ["Conv"]
    assert {i.name for i in folded.graph.input} == {"x", "w.affine", "b.affine"}
    # The reference evaluator's opset-9 BatchNormalization (what the
    # converted model has) disagrees with its opset-15 one and NumPy.
    check_folds(model, rand(1, 3, 5, 5), folded_ops=1, reference=False)


def test_folding_can_be_turned_off():
    params = batch_norm_params(4)
    bn = helper.make_node("BatchNormalization", ["c", *(n for n, _ in params)], ["y"])
    model = conv_model([bn], (1, 3, 5, 5), 4, bias=False, extra=params)
    for fold in (False, True):
        program, _ = import_model(model, fold_batch_norm=fold)
        assert ("multiply" in [i.op for i in program.instructions]) is not fold


def test_float16_conv_with_float32_statistics():
    """Opset 15's BN takes statistics of another float type than X: the fold
    works in float64 and rounds once, to the float16 weight."""
    params = batch_norm_params(4)
    bn = helper.make_node("BatchNormalization", ["c", *(n for n, _ in params)], ["y"])
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])
    inits = [("w", rand(4, 3, 3, 3).astype(np.float16)), ("b", rand(4).astype(np.float16)),
             *params]
    model = graph_model([conv, bn], [("x", TensorProto.FLOAT16, [1, 3, 5, 5])], ["y"], inits)
    x = rand(1, 3, 5, 5).astype(np.float16)
    (plain,), _ = run(model, x, fold=False)
    (folded,), program = run(model, x, fold=True)
    assert folded.dtype == np.float16 and "multiply" not in [i.op for i in program.instructions]
    np.testing.assert_allclose(folded.astype(np.float32), plain.astype(np.float32),
                               rtol=1e-2, atol=1e-2)
