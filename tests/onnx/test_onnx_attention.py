"""The Attention converter against ONNX's reference evaluator."""

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_cases import check_model, graph_model, node_model, normal_f32

rng = np.random.default_rng(11)

f32 = normal_f32(rng)


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


def test_rotary_embedding_interleaved_partial_and_bad_dim():
    from mlxprog.onnx import OnnxImportError, import_model

    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)  # [batch, heads, seq, head]
    cos, sin = (rng.standard_normal((10, 2)).astype(np.float32) for _ in range(2))
    positions = np.array([[0, 2, 4, 6], [1, 3, 5, 7]], np.int64)
    inputs = {"x": x, "cos": cos, "sin": sin, "pos": positions}
    model = node_model("RotaryEmbedding", inputs, opset=23, interleaved=1,
                       rotary_embedding_dim=4)
    check_model(model, inputs)
    with pytest.raises(OnnxImportError, match="rotary_embedding_dim=3"):
        import_model(node_model("RotaryEmbedding", inputs, opset=23, rotary_embedding_dim=3))


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention_rules_gqa(rule):
    rng = np.random.default_rng(10)
    b, t, hq, hkv, dk, dv = 2, 5, 4, 2, 3, 2
    inputs = {"q": rng.standard_normal((b, t, hq * dk)).astype(np.float32),
              "k": rng.standard_normal((b, t, hkv * dk)).astype(np.float32) * 0.5,
              "v": rng.standard_normal((b, t, hkv * dv)).astype(np.float32),
              "past": rng.standard_normal((b, hkv, dk, dv)).astype(np.float32)}
    if rule in ("gated", "gated_delta"):
        inputs["decay"] = -rng.uniform(0, 1, (b, t, hkv * dk)).astype(np.float32)
    if rule in ("delta", "gated_delta"):
        inputs["beta"] = rng.uniform(0, 1, (b, t, hkv)).astype(np.float32)
    names = ["q", "k", "v", "past", "decay" if "decay" in inputs else ""]
    names = names + ["beta"] if "beta" in inputs else names
    node = helper.make_node("LinearAttention", names, ["y", "state"], q_num_heads=hq,
                            kv_num_heads=hkv, update_rule=rule)
    model = graph_model([node], [(n, TensorProto.FLOAT, list(a.shape))
                                 for n, a in inputs.items()], ["y", "state"], opset=27)
    check_model(model, inputs, rtol=1e-4, atol=1e-5)


def test_linear_attention_missing_decay():
    from mlxprog.onnx import OnnxImportError, import_model

    node = helper.make_node("LinearAttention", ["q", "k", "v"], ["y"], q_num_heads=2,
                            kv_num_heads=2, update_rule="gated")
    model = graph_model([node], [(n, TensorProto.FLOAT, [1, 2, 4]) for n in "qkv"], ["y"],
                        opset=27)
    with pytest.raises(OnnxImportError, match="update_rule='gated' needs input 4"):
        import_model(model)


def test_flex_attention_score_mod_gqa_and_bad_precision():
    from mlxprog.onnx import OnnxImportError, import_model

    rng = np.random.default_rng(11)
    inputs = {"q": rng.standard_normal((1, 4, 3, 8)).astype(np.float32),
              "k": rng.standard_normal((1, 2, 5, 8)).astype(np.float32),
              "v": rng.standard_normal((1, 2, 5, 6)).astype(np.float32)}
    score = helper.make_graph(
        [helper.make_node("Tanh", ["s"], ["t"])], "score_mod",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])

    def model(**attrs):
        node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"],
                                domain="ai.onnx.preview", **attrs)
        m = graph_model([node], [(n, TensorProto.FLOAT, list(a.shape))
                                 for n, a in inputs.items()], ["y"], opset=26)
        m.opset_import.append(helper.make_opsetid("ai.onnx.preview", 1))
        return m

    check_model(model(score_mod=score, scale=0.5), inputs, rtol=1e-5, atol=1e-6)
    with pytest.raises(OnnxImportError, match="softmax_precision=7"):
        import_model(model(softmax_precision=7))
