"""The Attention converter against ONNX's reference evaluator."""

import numpy as np
import pytest

pytest.importorskip("onnx", reason="onnx (test dependency) is not installed")

from onnx import TensorProto, helper  # noqa: E402
from onnx_cases import check_model, graph_model, node_model  # noqa: E402

rng = np.random.default_rng(11)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def check(inputs, outputs=("y",), opset=23, **attrs):
    model = node_model("Attention", inputs, outputs, opset=opset, **attrs)
    return check_model(model, inputs, rtol=1e-4, atol=1e-5)


def test_4d_plain():
    check({"q": f32(2, 3, 4, 8), "k": f32(2, 3, 6, 8), "v": f32(2, 3, 6, 5)})


def test_3d_heads():
    check({"q": f32(2, 4, 12), "k": f32(2, 6, 12), "v": f32(2, 6, 9)},
          q_num_heads=3, kv_num_heads=3)


def test_gqa_causal_scale_softcap():
    check({"q": f32(1, 4, 5, 8), "k": f32(1, 2, 5, 8), "v": f32(1, 2, 5, 8)},
          is_causal=1, scale=0.3, softcap=2.0)


def test_bool_mask_short_padded():
    mask = rng.random((4, 3)) > 0.3
    check({"q": f32(1, 2, 4, 8), "k": f32(1, 2, 6, 8), "v": f32(1, 2, 6, 8), "m": mask})


def test_additive_mask_causal():
    check({"q": f32(2, 2, 4, 8), "k": f32(2, 2, 4, 8), "v": f32(2, 2, 4, 8), "m": f32(4, 4)},
          is_causal=1)


def test_fully_masked_row_is_zero():
    mask = np.ones((3, 4), bool)
    mask[1] = False
    y, = check({"q": f32(1, 1, 3, 4), "k": f32(1, 1, 4, 4), "v": f32(1, 1, 4, 4), "m": mask})
    assert not np.isnan(y).any() and (y[0, 0, 1] == 0).all()


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_past_present_and_qk_output(mode):
    inputs = {"q": f32(1, 2, 3, 4), "k": f32(1, 2, 3, 4), "v": f32(1, 2, 3, 4),
              "m": f32(3, 5), "pk": f32(1, 2, 2, 4), "pv": f32(1, 2, 2, 4)}
    check(inputs, ("y", "pk_out", "pv_out", "qk"), is_causal=1, qk_matmul_output_mode=mode)


def test_nonpad_kv_seqlen_causal():
    # opset 24's external cache: per batch, keys past nonpad_kv_seqlen are
    # padding and the causal frontier is offset by nonpad_kv_seqlen - q_len.
    inputs = {"q": f32(2, 2, 2, 4), "k": f32(2, 2, 6, 4), "v": f32(2, 2, 6, 4)}
    node = helper.make_node("Attention", ["q", "k", "v", "", "", "", "n"], ["y"], is_causal=1)
    model = graph_model([node], [(k, TensorProto.FLOAT, list(a.shape)) for k, a in inputs.items()]
                        + [("n", TensorProto.INT64, [2])], ["y"], opset=24)
    check_model(model, {**inputs, "n": np.array([4, 6], np.int64)}, rtol=1e-4, atol=1e-5)


def test_sliding_window_gqa_3d():
    check({"q": f32(1, 6, 8), "k": f32(1, 6, 4), "v": f32(1, 6, 4)}, opset=26,
          q_num_heads=2, kv_num_heads=1, is_causal=1, left_window_size=2)
