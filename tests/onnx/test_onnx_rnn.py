"""The recurrent converters (convert/rnn.py): RNN, GRU, LSTM against ONNX's
reference evaluator, and against a NumPy model for what the reference ignores
(activations, clip, input_forget of GRU/LSTM)."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx_cases import OPSET, check_model, run_mlxprog, value_info

from mlxprog.onnx import OnnxImportError, import_model

RNG = np.random.default_rng(2)
T, B, I, H = 4, 3, 5, 6
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def rand(*shape, scale=0.5):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def rnn_inputs(op, dirs, layout=0, bias=True, init=True, peep=False):
    g = GATES[op]
    x = rand(T, B, I) if layout == 0 else rand(B, T, I)
    arrays = {"W": rand(dirs, g * H, I), "R": rand(dirs, g * H, H)}
    names = ["x", "W", "R"]
    if bias:
        arrays["B"] = rand(dirs, 2 * g * H)
    names.append("B" if bias else "")
    names.append("")  # sequence_lens
    state = (lambda: rand(dirs, B, H)) if layout == 0 else (lambda: rand(B, dirs, H))
    if init:
        arrays["h0"] = state()
    names.append("h0" if init else "")
    if op == "LSTM":
        if init:
            arrays["c0"] = state()
        names.append("c0" if init else "")
        if peep:
            arrays["P"] = rand(dirs, 3 * H)
        names.append("P" if peep else "")
    while names and names[-1] == "":
        names.pop()
    return x, arrays, names


def rnn_model(op, x, arrays, names, outputs, as_inputs=False, **attrs):
    node = helper.make_node(op, names, list(outputs), **attrs)
    inputs = [value_info("x", x)]
    inits = []
    for n, a in arrays.items():
        if as_inputs:
            inputs.append(value_info(n, a))
        else:
            inits.append(numpy_helper.from_array(a, n))
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_value_info(o, onnx.TypeProto()) for o in outputs if o],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


OUTS = {"RNN": ("y", "yh"), "GRU": ("y", "yh"), "LSTM": ("y", "yh", "yc")}


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_recurrent_directions_layouts(op, direction, layout):
    dirs = 2 if direction == "bidirectional" else 1
    x, arrays, names = rnn_inputs(op, dirs, layout, peep=(op == "LSTM"))
    model = rnn_model(op, x, arrays, names, OUTS[op], hidden_size=H, direction=direction,
                      layout=layout)
    check_model(model, {"x": x}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_recurrent_no_bias_no_state_only_y(op):
    x, arrays, names = rnn_inputs(op, 1, bias=False, init=False)
    check_model(rnn_model(op, x, arrays, names, ("y",), hidden_size=H), {"x": x},
                rtol=1e-4, atol=1e-5)
    check_model(rnn_model(op, x, arrays, names, ("", "yh"), hidden_size=H), {"x": x},
                rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_recurrent_weights_as_graph_inputs(op):
    x, arrays, names = rnn_inputs(op, 2, peep=(op == "LSTM"))
    model = rnn_model(op, x, arrays, names, OUTS[op], as_inputs=True, hidden_size=H,
                      direction="bidirectional")
    check_model(model, {"x": x, **arrays}, rtol=1e-4, atol=1e-5)


def test_gru_linear_before_reset():
    x, arrays, names = rnn_inputs("GRU", 2)
    model = rnn_model("GRU", x, arrays, names, OUTS["GRU"], hidden_size=H,
                      direction="bidirectional", linear_before_reset=1)
    check_model(model, {"x": x}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("act", ["Relu", "Softsign"])
def test_rnn_activation(act):
    # the reference evaluator's RNN knows Tanh and Affine only: NumPy here
    x, arrays, names = rnn_inputs("RNN", 1)
    model = rnn_model("RNN", x, arrays, names, OUTS["RNN"], hidden_size=H, activations=[act])
    y, yh = run_mlxprog(model, {"x": x})
    W, R, Bb = arrays["W"][0], arrays["R"][0], arrays["B"][0]
    h, ys = arrays["h0"][0], []
    for xt in x:
        h = ACTS[act](xt @ W.T + h @ R.T + Bb[:H] + Bb[H:])
        ys.append(h)
    np.testing.assert_allclose(y, np.stack(ys)[:, None], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(yh, h[None], rtol=1e-4, atol=1e-5)


# -- what the reference evaluator ignores: a NumPy LSTM / GRU --------------------------------

def _sig(v):
    return 1 / (1 + np.exp(-v))


ACTS = {"Sigmoid": _sig, "Tanh": np.tanh, "Relu": lambda v: np.maximum(v, 0),
        "HardSigmoid": lambda v: np.clip(0.2 * v + 0.5, 0, 1),
        "Softsign": lambda v: v / (1 + np.abs(v))}


def numpy_lstm(x, a, acts, clip=None, input_forget=False):
    f, g, h_act = (ACTS[n] for n in acts)
    cl = (lambda v: np.clip(v, -clip, clip)) if clip else (lambda v: v)
    W, R, Bb = a["W"][0], a["R"][0], a["B"][0]
    h, c = a["h0"][0].astype(np.float64), a["c0"][0].astype(np.float64)
    ys = []
    for xt in x:
        pre = xt @ W.T + h @ R.T + Bb[:4 * H] + Bb[4 * H:]
        i, o, fg, cc = np.split(pre, 4, -1)
        i = f(cl(i))
        fg = 1 - i if input_forget else f(cl(fg))
        c = fg * c + i * g(cl(cc))
        h = f(cl(o)) * h_act(c)
        ys.append(h)
    return np.stack(ys)[:, None], h[None], c[None]


def numpy_gru(x, a, acts, clip=None):
    f, g = (ACTS[n] for n in acts)
    cl = (lambda v: np.clip(v, -clip, clip)) if clip else (lambda v: v)
    W, R, Bb = a["W"][0], a["R"][0], a["B"][0]
    Wb, Rb = np.split(Bb, 2)
    h = a["h0"][0].astype(np.float64)
    ys = []
    for xt in x:
        xz, xr, xh = np.split(xt @ W.T + Wb, 3, -1)
        rz, rr, rh = np.split(R, 3, 0)
        bz, br, bh = np.split(Rb, 3)
        z = f(cl(xz + h @ rz.T + bz))
        r = f(cl(xr + h @ rr.T + br))
        n = g(cl(xh + (r * h) @ rh.T + bh))
        h = (1 - z) * n + z * h
        ys.append(h)
    return np.stack(ys)[:, None], h[None]


@pytest.mark.parametrize("acts,clip,input_forget", [
    (["Sigmoid", "Tanh", "Tanh"], 0.3, False),
    (["HardSigmoid", "Softsign", "Relu"], None, True),
])
def test_lstm_activations_clip_input_forget(acts, clip, input_forget):
    x, arrays, names = rnn_inputs("LSTM", 1)
    attrs = {"hidden_size": H, "activations": acts, "input_forget": int(input_forget)}
    if clip:
        attrs["clip"] = clip
    got = run_mlxprog(rnn_model("LSTM", x, arrays, names, OUTS["LSTM"], **attrs), {"x": x})
    for g, w in zip(got, numpy_lstm(x, arrays, acts, clip, input_forget)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_gru_activations_clip():
    x, arrays, names = rnn_inputs("GRU", 1)
    acts = ["HardSigmoid", "Softsign"]
    got = run_mlxprog(rnn_model("GRU", x, arrays, names, OUTS["GRU"], hidden_size=H,
                                activations=acts, clip=0.4), {"x": x})
    for g, w in zip(got, numpy_gru(x, arrays, acts, 0.4)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_symbolic_batch_and_errors():
    x, arrays, names = rnn_inputs("LSTM", 1, init=False)
    node = helper.make_node("LSTM", names, ["y", "yh"], hidden_size=H)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [T, "N", I])],
        [helper.make_value_info(o, onnx.TypeProto()) for o in ("y", "yh")],
        [numpy_helper.from_array(a, n) for n, a in arrays.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    check_model(model, {"x": x}, rtol=1e-4, atol=1e-5)

    # a symbolic sequence length cannot be unrolled
    model.graph.input[0].CopyFrom(helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                          ["T", B, I]))
    with pytest.raises(OnnxImportError, match="sequence length"):
        import_model(model)
    # sequence_lens all equal to the sequence length
    names2 = ["x", "W", "R", "B", "lens"]
    check_model(rnn_model("LSTM", x, dict(arrays, lens=np.full(B, T, np.int32)), names2,
                          ("y",), hidden_size=H), {"x": x}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("as_input", [False, True])
def test_sequence_lens(op, direction, as_input):
    # The reference evaluator ignores sequence_lens: each batch entry is checked against
    # the reference run on that entry's sequence alone (and zeros past its end).
    dirs = 2 if direction == "bidirectional" else 1
    x, arrays, names = rnn_inputs(op, dirs, peep=(op == "LSTM"))
    lens = np.array([T, 1, T - 1], np.int32)
    names = list(names) + [""] * (8 - len(names))
    names[4] = "lens"
    while names[-1] == "":
        names.pop()
    attrs = {"hidden_size": H, "direction": direction}
    model = rnn_model(op, x, dict(arrays, lens=lens), names, OUTS[op],
                      as_inputs=as_input, **attrs)
    feeds = {"x": x, **arrays, "lens": lens} if as_input else {"x": x}
    got = run_mlxprog(model, feeds)
    for bi, n in enumerate(lens):
        sub = {k: (v[:, bi:bi + 1] if k in ("h0", "c0") else v) for k, v in arrays.items()}
        names_b = [nm if nm != "lens" else "" for nm in names]
        ref = ReferenceEvaluator(rnn_model(op, x[:n, bi:bi + 1], sub, names_b, OUTS[op],
                                           **attrs)).run(None, {"x": x[:n, bi:bi + 1]})
        np.testing.assert_allclose(got[0][:n, :, bi], ref[0][:, :, 0], rtol=1e-4, atol=1e-5)
        assert not got[0][n:, :, bi].any()
        for g, r in zip(got[1:], ref[1:]):
            np.testing.assert_allclose(g[:, bi], r[:, 0], rtol=1e-4, atol=1e-5)
