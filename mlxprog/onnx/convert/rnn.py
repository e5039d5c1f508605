"""Recurrent layers: RNN, GRU, LSTM.

The sequence is *unrolled* at import: its length must be known then (the
batch may be symbolic). That keeps each step a few plain instructions
(``matmul``, elementwise ops) the backend fuses freely, and the input
projection of every step is one ``matmul`` over the whole sequence before
the loop; the program grows with the sequence length, which suits the
short, fixed sequences of exported models. (A ``while`` loop would be the
way for long or symbolic sequences: not done.)

Covered: directions forward, reverse and bidirectional; layouts 0 and 1;
initial states; biases; LSTM peepholes and ``input_forget``; ``clip``; the
activations of the ONNX spec with their alphas/betas; GRU's
``linear_before_reset``; ``sequence_lens``, known at import or not (the
steps past a batch entry's length leave its state as it is and give zeros
in Y). Weights known at import are transposed then.
"""

from __future__ import annotations

import numpy as np

from ..context import Context
from ..registry import converter

#: Activation -> how many of activation_alpha / activation_beta it takes.
_ACTIVATION_PARAMS = {
    "Relu": (0, 0), "Tanh": (0, 0), "Sigmoid": (0, 0), "Softsign": (0, 0),
    "Softplus": (0, 0), "Affine": (1, 1), "LeakyRelu": (1, 0), "ThresholdedRelu": (1, 0),
    "ScaledTanh": (1, 1), "HardSigmoid": (1, 1), "Elu": (1, 0),
}
_ACTIVATION_DEFAULTS = {"LeakyRelu": (0.01, None), "ThresholdedRelu": (1.0, None),
                        "HardSigmoid": (0.2, 0.5), "Elu": (1.0, None),
                        "Affine": (1.0, 0.0), "ScaledTanh": (1.0, 1.0)}


def _activations(ctx: Context, defaults: list[str], directions: int):
    """The activation functions per direction (``len(defaults)`` each)."""
    names = ctx.attr("activations", None)
    alphas = list(ctx.attr("activation_alpha", []))
    betas = list(ctx.attr("activation_beta", []))
    if names is None:
        names = defaults * directions
    if len(names) != len(defaults) * directions:
        raise ctx.fail(f"activations needs {len(defaults) * directions} entries "
                       f"({len(defaults)} per direction); found {len(names)}")
    fns = []
    for name in names:
        key = next((k for k in _ACTIVATION_PARAMS if k.lower() == name.lower()), None)
        if key is None:
            raise ctx.fail(f"activation {name!r} is not supported "
                           f"(supported: {', '.join(_ACTIVATION_PARAMS)})")
        na, nb = _ACTIVATION_PARAMS[key]
        da, db = _ACTIVATION_DEFAULTS.get(key, (None, None))
        alpha = alphas.pop(0) if na and alphas else da
        beta = betas.pop(0) if nb and betas else db
        fns.append(_activation(ctx, key, alpha, beta))
    return [fns[d * len(defaults):(d + 1) * len(defaults)] for d in range(directions)]


def _activation(ctx: Context, name: str, alpha, beta):
    b = ctx.b

    def c(v, like):
        return ctx.scalar(float(v), like)

    def fn(x):
        if name == "Sigmoid":
            return b.sigmoid(x)
        if name == "Tanh":
            return b.tanh(x)
        if name == "Relu":
            return b.max(x, c(0, x))
        if name == "Softsign":
            return x / (b.abs(x) + c(1, x))
        if name == "Softplus":
            return b.log1p(b.exp(x))
        if name == "Affine":
            return x * c(alpha, x) + c(beta, x)
        if name == "LeakyRelu":
            return b.select(b.greater_equal(x, c(0, x)), x, x * c(alpha, x))
        if name == "ThresholdedRelu":
            return b.select(b.greater(x, c(alpha, x)), x, c(0, x))
        if name == "ScaledTanh":
            return b.tanh(x * c(beta, x)) * c(alpha, x)
        if name == "HardSigmoid":
            return b.clip(x * c(alpha, x) + c(beta, x), c(0, x), c(1, x))
        # Elu
        return b.select(b.greater_equal(x, c(0, x)), x, (b.exp(x) - c(1, x)) * c(alpha, x))
    return fn


class _Weights:
    """One direction's weights as program values, W and R transposed."""

    def __init__(self, ctx: Context, d: int, gates: int, hidden: int):
        b = ctx.b
        self.ctx = ctx
        dt = np.dtype(ctx.dtype(0))

        def matrix(i: int, key: str):
            const = ctx.constant(i)
            if const is not None and const.dtype != object:
                return _import(ctx, f"{ctx.node.input[i]}.{key}{d}.T",
                               np.asarray(const)[d].T.astype(dt))
            v = ctx.input(i)
            v = b.squeeze(b.slice(v, lengths=[1, *ctx.shape(i)[1:]], starts=[d, 0, 0]), axes=[0])
            return b.transpose(v, axes=[1, 0])

        self.w = matrix(1, "W")
        self.r = matrix(2, "R")
        self.wb = self.rb = None
        if ctx.has_input(3):
            const = ctx.constant(3)
            if const is not None and const.dtype != object:
                bias = np.asarray(const)[d].astype(dt)
                self.wb = _import(ctx, f"{ctx.node.input[3]}.Wb{d}", bias[:gates * hidden])
                self.rb = _import(ctx, f"{ctx.node.input[3]}.Rb{d}", bias[gates * hidden:])
            else:
                v = b.squeeze(b.slice(ctx.input(3), lengths=[1, 2 * gates * hidden],
                                      starts=[d, 0]), axes=[0])
                self.wb, self.rb = b.split(v, indices_or_sections=2, axis=0)


def _import(ctx: Context, key: str, array: np.ndarray):
    return ctx.scope.importer.materialize(key, np.ascontiguousarray(array), ctx.scope)


def _direction_state(ctx: Context, i: int, d: int, batch, hidden: int, layout: int):
    """Initial state input ``i`` for direction ``d`` as ``[B, H]`` (zeros when absent)."""
    b = ctx.b
    dt = np.dtype(ctx.dtype(0)).name
    if not ctx.has_input(i):
        return b.full(shape=[batch, hidden], dtype=dt, value=0)
    v = ctx.input(i)
    shape = list(ctx.shape(i))
    if layout == 0:  # [D, B, H]
        v = b.slice(v, lengths=[1, *shape[1:]], starts=[d, 0, 0])
        return b.squeeze(v, axes=[0])
    v = b.slice(v, lengths=[shape[0], 1, shape[2]], starts=[0, d, 0])  # [B, D, H]
    return b.squeeze(v, axes=[1])


def _common(ctx: Context, gates: int):
    """``(x, steps, batch, hidden, passes, layout, lens)``: the input ``[T, B,
    I]`` (layout 1 transposed to it), the sizes, one entry per direction
    saying whether that pass runs backwards in time, the layout, and the
    sequence lengths ``[B, 1]`` (None when every sequence is full length)."""
    b = ctx.b
    layout = int(ctx.attr("layout", 0))
    if layout not in (0, 1):
        raise ctx.fail(f"layout={layout} is not supported (0 or 1)")
    shape = list(ctx.shape(0))
    if len(shape) != 3:
        raise ctx.fail(f"X must be rank 3; found {shape}")
    steps, batch = (shape[0], shape[1]) if layout == 0 else (shape[1], shape[0])
    if not isinstance(steps, int):
        raise ctx.fail(f"the sequence length must be known at import (the recurrence is "
                       f"unrolled); found {steps!r}")
    wshape = ctx.shape(1)
    hidden = int(ctx.attr("hidden_size", wshape[1] // gates))
    direction = ctx.choice("direction", ("forward", "reverse", "bidirectional"), "forward")
    passes = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]
    directions = len(passes)
    if wshape[0] != directions:
        raise ctx.fail(f"W has {wshape[0]} directions; direction={direction!r} needs "
                       f"{directions}")
    lens = None
    if ctx.has_input(4):
        known = ctx.constant(4)
        if known is None or known.dtype == object or not np.all(np.asarray(known) == steps):
            lens = b.expand_dims(b.astype(ctx.input(4), dtype="int32"), axes=[1])  # [B, 1]
    x = ctx.input(0)
    if layout == 1:
        x = b.transpose(x, axes=[1, 0, 2])
    return x, steps, batch, hidden, passes, layout, lens


def _masked(ctx: Context, lens, t: int, new, old, zero_when_off: bool = False):
    """With ``sequence_lens``: ``new`` where step ``t`` is inside the batch
    entry's sequence, else ``old`` (the state holds; the output is 0). Past a
    sequence's end a forward pass holds its last state, and a reverse pass
    keeps its initial state until it reaches the sequence's last step: each
    sequence is run over its own length, in either direction."""
    if lens is None:
        return new
    b = ctx.b
    inside = b.less(b.constant(t, "int32"), lens)
    return b.select(inside, new, ctx.scalar(0, new) if zero_when_off else old)


def _project(ctx: Context, x, weights: _Weights, steps: int):
    """``X W^T + Wb`` for every step at once, split into steps ``[B, G]``."""
    b = ctx.b
    xw = b.matmul(x, weights.w)
    if weights.wb is not None:
        xw = xw + weights.wb
    if steps == 1:
        return [b.squeeze(xw, axes=[0])]
    return [b.squeeze(p, axes=[0]) for p in b.split(xw, indices_or_sections=steps, axis=0)]


def _recurrence(ctx: Context, x_t, h, weights: _Weights):
    """A step's gate pre-activations: ``X_t W^T + Wb`` (projected) plus
    ``H R^T + Rb``."""
    pre = x_t + ctx.b.matmul(h, weights.r)
    return pre if weights.rb is None else pre + weights.rb


def _clip(ctx: Context, v):
    clip = ctx.attr("clip", None)
    if clip is None:
        return v
    return ctx.b.clip(v, ctx.scalar(-float(clip), v), ctx.scalar(float(clip), v))


def _outputs(ctx: Context, ys_per_dir, finals_per_state, layout: int) -> list:
    """Y ``[T, D, B, H]`` (layout 1: ``[B, T, D, H]``) and each final state
    ``[D, B, H]`` (layout 1: ``[B, D, H]``)."""
    b = ctx.b
    results = []
    if ctx.wants_output(0):
        per_dir = [b.stack(*ys, axis=0) for ys in ys_per_dir]  # [T, B, H]
        y = b.stack(*per_dir, axis=1)  # [T, D, B, H]
        results.append(b.transpose(y, axes=[2, 0, 1, 3]) if layout == 1 else y)
    else:
        results.append(None)
    for k, finals in enumerate(finals_per_state):
        if ctx.wants_output(k + 1):
            s = b.stack(*finals, axis=0)  # [D, B, H]
            results.append(b.transpose(s, axes=[1, 0, 2]) if layout == 1 else s)
        else:
            results.append(None)
    return results[:ctx.num_outputs]


def _order(reverse: bool, steps: int) -> list[int]:
    """The time steps of a pass, in the order it visits them."""
    return list(range(steps - 1, -1, -1)) if reverse else list(range(steps))


@converter("RNN")
def rnn(ctx: Context) -> list:
    """``H = f(X W^T + H R^T + Wb + Rb)``."""
    x, steps, batch, hidden, passes, layout, lens = _common(ctx, 1)
    acts = _activations(ctx, ["Tanh"], len(passes))
    ys_all, finals = [], []
    for d, reverse in enumerate(passes):
        w = _Weights(ctx, d, 1, hidden)
        xs = _project(ctx, x, w, steps)
        h = _direction_state(ctx, 5, d, batch, hidden, layout)
        ys = [None] * steps
        for t in _order(reverse, steps):
            pre = _recurrence(ctx, xs[t], h, w)
            new = acts[d][0](_clip(ctx, pre))
            ys[t] = _masked(ctx, lens, t, new, None, True)
            h = _masked(ctx, lens, t, new, h)
        ys_all.append(ys)
        finals.append(h)
    return _outputs(ctx, ys_all, [finals], layout)


@converter("GRU")
def gru(ctx: Context) -> list:
    """Gates z, r, h; ``linear_before_reset`` applies R_h before the reset gate."""
    b = ctx.b
    x, steps, batch, hidden, passes, layout, lens = _common(ctx, 3)
    acts = _activations(ctx, ["Sigmoid", "Tanh"], len(passes))
    linear_before_reset = bool(ctx.attr("linear_before_reset", 0))
    ys_all, finals = [], []
    for d, reverse in enumerate(passes):
        f, g = acts[d]
        w = _Weights(ctx, d, 3, hidden)
        xs = _project(ctx, x, w, steps)
        h = _direction_state(ctx, 5, d, batch, hidden, layout)
        rz_r, rr_r, rh_r = b.split(w.r, indices_or_sections=3, axis=1)
        rzr = b.concatenate(rz_r, rr_r, axis=1)
        if w.rb is not None:
            rbz, rbr, rbh = b.split(w.rb, indices_or_sections=3, axis=0)
            rbzr = b.concatenate(rbz, rbr, axis=0)
        ys = [None] * steps
        for t in _order(reverse, steps):
            xz, xr, xh = b.split(xs[t], indices_or_sections=3, axis=-1)
            hzr = b.matmul(h, rzr)
            if w.rb is not None:
                hzr = hzr + rbzr
            hz, hr = b.split(hzr, indices_or_sections=2, axis=-1)
            z = f(_clip(ctx, xz + hz))
            r = f(_clip(ctx, xr + hr))
            if linear_before_reset:
                hh = b.matmul(h, rh_r)
                if w.rb is not None:
                    hh = hh + rbh
                cand = xh + r * hh
            else:
                cand = xh + b.matmul(r * h, rh_r)
                if w.rb is not None:
                    cand = cand + rbh
            n = g(_clip(ctx, cand))
            new = n + z * (h - n)  # (1 - z) * n + z * h
            ys[t] = _masked(ctx, lens, t, new, None, True)
            h = _masked(ctx, lens, t, new, h)
        ys_all.append(ys)
        finals.append(h)
    return _outputs(ctx, ys_all, [finals], layout)


@converter("LSTM")
def lstm(ctx: Context) -> list:
    """Gates i, o, f, c; peepholes P (i, o, f); ``input_forget`` couples f = 1 - i."""
    b = ctx.b
    x, steps, batch, hidden, passes, layout, lens = _common(ctx, 4)
    acts = _activations(ctx, ["Sigmoid", "Tanh", "Tanh"], len(passes))
    input_forget = bool(ctx.attr("input_forget", 0))
    ys_all, h_finals, c_finals = [], [], []
    dt = np.dtype(ctx.dtype(0))
    for d, reverse in enumerate(passes):
        f, g, hact = acts[d]
        w = _Weights(ctx, d, 4, hidden)
        xs = _project(ctx, x, w, steps)
        h = _direction_state(ctx, 5, d, batch, hidden, layout)
        c = _direction_state(ctx, 6, d, batch, hidden, layout)
        peep = None
        if ctx.has_input(7):
            const = ctx.constant(7)
            if const is not None and const.dtype != object:
                p = np.asarray(const)[d].astype(dt)
                if np.any(p):
                    peep = [_import(ctx, f"{ctx.node.input[7]}.P{d}{k}",
                                    p[k * hidden:(k + 1) * hidden]) for k in range(3)]
            else:
                pv = b.squeeze(b.slice(ctx.input(7), lengths=[1, 3 * hidden], starts=[d, 0]),
                               axes=[0])
                peep = list(b.split(pv, indices_or_sections=3, axis=0))
        ys = [None] * steps
        for t in _order(reverse, steps):
            pre = _recurrence(ctx, xs[t], h, w)
            pi, po, pf, pc = b.split(pre, indices_or_sections=4, axis=-1)
            if peep is not None:
                pi = pi + peep[0] * c
                pf = pf + peep[2] * c
            i = f(_clip(ctx, pi))
            fg = (ctx.scalar(1, i) - i) if input_forget else f(_clip(ctx, pf))
            cc = g(_clip(ctx, pc))
            c_new = fg * c + i * cc
            if peep is not None:
                po = po + peep[1] * c_new
            o = f(_clip(ctx, po))
            new = o * hact(c_new)
            ys[t] = _masked(ctx, lens, t, new, None, True)
            h = _masked(ctx, lens, t, new, h)
            c = _masked(ctx, lens, t, c_new, c)
        ys_all.append(ys)
        h_finals.append(h)
        c_finals.append(c)
    return _outputs(ctx, ys_all, [h_finals, c_finals], layout)
