"""Signal converters (windows, DFT, STFT) against the reference evaluator."""

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper
from onnx_cases import check_model, check_node, graph_model, node_model

from mlxprog.onnx import OnnxImportError, import_model

rng = np.random.default_rng(3)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_window_symbolic_size(op, periodic):
    """A window as long as a symbolic dim (a known size is folded at import);
    float64, to float32 accuracy (MLX's float64 cosine is)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Squeeze", ["s"], ["n"]),
             helper.make_node(op, ["n"], ["w"], periodic=periodic,
                              output_datatype=T.DOUBLE),
             helper.make_node("Mul", ["w", "x"], ["y"])]
    model = graph_model(nodes, [("x", T.DOUBLE, ["N"])], ["y"])
    check_model(model, {"x": rng.standard_normal(10)}, rtol=1e-6, atol=1e-7)


def test_window_bad_periodic():
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Squeeze", ["s"], ["n"]),
             helper.make_node("HannWindow", ["n"], ["y"], periodic=2)]
    with pytest.raises(OnnxImportError, match="periodic=2"):
        import_model(graph_model(nodes, [("x", T.FLOAT, ["N"])], ["y"]))


@pytest.mark.parametrize("inverse,onesided,last", [(0, 0, 1), (0, 0, 2), (0, 1, 1), (1, 0, 2),
                                                   (1, 1, 2)])
@pytest.mark.parametrize("length", [None, 6, 12])
def test_dft(inverse, onesided, last, length):
    """Both forms: opset 17 (axis an attribute) and 20 (an input), float64
    (the matrix products keep it), with dft_length padding or truncating."""
    x = rng.standard_normal((2, 8, 3, last))
    n = {} if length is None else {"n": np.array(length, np.int64)}
    old = node_model("DFT", {"x": x}, initializers=n, opset=17, inverse=inverse,
                     onesided=onesided, axis=1)
    new = node_model("DFT", {"x": x}, initializers={"n": np.array(length or 8, np.int64),
                                                    "axis": np.array(-3, np.int64)},
                     opset=20, inverse=inverse, onesided=onesided)
    for model in (old, new):
        check_model(model, {"x": x}, rtol=1e-9, atol=1e-9)


def test_dft_bad_axis():
    x = np.zeros((2, 8, 2), np.float32)
    with pytest.raises(OnnxImportError, match="real/imaginary axis"):
        import_model(node_model("DFT", {"x": x}, opset=17, axis=2))
    with pytest.raises(OnnxImportError, match="inverse=3"):
        import_model(node_model("DFT", {"x": x}, opset=17, inverse=3))


def test_stft_with_window():
    x = rng.standard_normal((2, 40, 1)).astype(np.float32)
    window = np.hanning(16).astype(np.float32)
    check_node("STFT", {"x": x}, initializers={"step": np.array(6, np.int64), "w": window},
               rtol=1e-4, atol=1e-4)


def test_stft_bad_frame_length():
    x = np.zeros((1, 10, 1), np.float32)
    with pytest.raises(OnnxImportError, match="frame_length 20"):
        import_model(node_model("STFT", {"x": x}, initializers={
            "step": np.array(2, np.int64), "": np.zeros(0),
            "len": np.array(20, np.int64)}))


def test_mel_weight_matrix_folded_and_runtime_input():
    """Known inputs: computed at import (the model imports); an input
    computed at run time is an error naming it."""
    consts = [helper.make_node("Constant", [], [n], value=helper.make_tensor(n, T.INT64, [], [v]))
              for n, v in (("bins", 8), ("dft", 16), ("rate", 8000))]
    consts += [helper.make_node("Constant", [], [n], value=helper.make_tensor(n, T.FLOAT, [], [v]))
               for n, v in (("lo", 0.0), ("hi", 4000.0))]
    mel = helper.make_node("MelWeightMatrix", ["bins", "dft", "rate", "lo", "hi"], ["m"])
    nodes = [*consts, mel, helper.make_node("MatMul", ["x", "m"], ["y"])]
    model = graph_model(nodes, [("x", T.FLOAT, [2, 9])], ["y"])
    check_model(model, {"x": rng.standard_normal((2, 9)).astype(np.float32)}, rtol=1e-5)
    runtime = graph_model([*consts[1:], helper.make_node(
        "MelWeightMatrix", ["n", "dft", "rate", "lo", "hi"], ["y"])], [("n", T.INT64, [])], ["y"])
    with pytest.raises(OnnxImportError, match="num_mel_bins"):
        import_model(runtime)
