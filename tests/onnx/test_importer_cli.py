"""``mlxprog import-onnx``, then ``mlxprog run`` and ``inspect`` on what it wrote."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from mlxprog.cli import main


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def affine_model(path, x_shape=("N", 3)):
    """y = relu(x @ w + b) with a symbolic batch dim, and outputs that read
    float64, bool and int64 weights (the dtypes a weights file must hold)."""
    inits = {"w": np.arange(12, dtype=np.float32).reshape(3, 4) / 10,
             "b": np.array([0.5, -4.0, 0.0, 1.0], np.float32),
             "d": np.array([1.5, 2.5, -1.0], np.float64),
             "mask": np.arange(300) % 3 == 0, "idx": np.arange(300, dtype=np.int64)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]),
             helper.make_node("Add", ["xw", "b"], ["z"]),
             helper.make_node("Relu", ["z"], ["y"]),
             helper.make_node("Cast", ["x"], ["x64"], to=TensorProto.DOUBLE),
             helper.make_node("Mul", ["x64", "d"], ["dd"]),
             helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Cast", ["total"], ["n"], to=TensorProto.INT64),
             helper.make_node("Where", ["mask", "idx", "n"], ["picked"])]
    graph = helper.make_graph(
        nodes, "affine", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_value_info(n, onnx.TypeProto()) for n in ("y", "dd", "picked")],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.save(model, str(path))
    return model


def test_import_then_run_and_inspect(capsys, tmp_path):
    model = affine_model(tmp_path / "m.onnx")
    out = tmp_path / "out"
    code, stdout, err = run_cli(capsys, "import-onnx", tmp_path / "m.onnx", "-o", out)
    assert code == 0, err
    for name in ("program.json", "weights.safetensors", "weights-float64.npz"):
        assert f"wrote {out / name}" in stdout
        assert (out / name).is_file()

    x = np.array([[1, 2, 3], [-1, 0, 2]], np.float32)
    np.save(tmp_path / "x.npy", x)
    code, stdout, err = run_cli(capsys, "run", out / "program.json", "--weights",
                                out / "weights.safetensors", "--weights",
                                out / "weights-float64.npz", "--input", f"x={tmp_path / 'x.npy'}",
                                "-o", tmp_path / "y.npz")
    assert code == 0, err
    got = np.load(tmp_path / "y.npz")
    for i, want in enumerate(ReferenceEvaluator(model).run(None, {"x": x})):
        np.testing.assert_allclose(got[f"output_{i}"], want, rtol=1e-6)
        assert got[f"output_{i}"].dtype == want.dtype

    code, stdout, err = run_cli(capsys, "inspect", out / "program.json")
    assert code == 0, err
    assert "x: float32[N, 3]" in stdout


def test_unsupported_ops_are_listed_in_one_line(capsys, tmp_path):
    nodes = [helper.make_node("StringNormalizer", ["x"], ["a"], name="norm1"),
             helper.make_node("StringNormalizer", ["a"], ["b"], name="norm2"),
             helper.make_node("TfIdfVectorizer", ["b"], ["y"], name="tfidf")]
    graph = helper.make_graph(
        nodes, "text", [helper.make_tensor_value_info("x", TensorProto.STRING, [2])],
        [helper.make_value_info("y", onnx.TypeProto())])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
              str(tmp_path / "text.onnx"))
    code, stdout, err = run_cli(capsys, "import-onnx", tmp_path / "text.onnx", "-o",
                                tmp_path / "out")
    assert code == 1
    assert err.count("\n") == 1
    assert "StringNormalizer (ai.onnx) x2: norm1, norm2" in err
    assert "TfIdfVectorizer (ai.onnx) x1: tfidf" in err
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_no_model_is_an_error(capsys, tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"\x00not a protobuf\xff" * 10)
    code, _, err = run_cli(capsys, "import-onnx", tmp_path / "bad.onnx", "-o", tmp_path / "o")
    assert code == 1
    assert err.startswith("error: cannot read ONNX model")
    code, _, err = run_cli(capsys, "import-onnx", tmp_path / "missing.onnx", "-o", tmp_path)
    assert code == 1 and "not found" in err


def conv_bn_model(path):
    """A Conv followed by an inference BatchNormalization (foldable)."""
    rng = np.random.default_rng(0)
    inits = {"w": rng.normal(size=(4, 2, 3, 3)).astype(np.float32),
             "scale": rng.uniform(0.5, 2, 4).astype(np.float32),
             "bias": rng.normal(size=4).astype(np.float32),
             "mean": rng.normal(size=4).astype(np.float32),
             "var": rng.uniform(0.5, 2, 4).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), str(path))


@pytest.mark.parametrize("flag, folded", [([], True), (["--no-fold-batch-norm"], False)])
def test_fold_batch_norm_flag(capsys, tmp_path, flag, folded):
    conv_bn_model(tmp_path / "m.onnx")
    code, _, err = run_cli(capsys, "import-onnx", tmp_path / "m.onnx", "-o", tmp_path / "o",
                           *flag)
    assert code == 0, err
    program = json.loads((tmp_path / "o" / "program.json").read_text())
    # Unfolded, the norm is a multiply and an add after the conv.
    assert (not any(i["op"] == "multiply" for i in program["instructions"])) is folded
