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

from collections.abc import Callable

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
    """One direction's weights as program values, W and R transposed, and
    the hidden size."""

    def __init__(self, ctx: Context, d: int, gates: int, hidden: int):
        b = ctx.b
        self.hidden = hidden
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
    return ctx.known_value(key, np.ascontiguousarray(array))


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


def _unrolled(ctx: Context, gates: int, activations: list[str], state_inputs: tuple[int, ...],
              cell: Callable) -> list:
    """The layer unrolled over its steps, one pass per direction: for each,
    ``cell(d, weights, activations)`` gives the pass's step, ``step(x_t,
    states) -> new states``, from the projected input of a step and the
    states (initial values: inputs ``state_inputs``; the first, H, is the
    step's output). Past a sequence's length (``sequence_lens``) the states
    hold and the output is 0. Y and each final state."""
    x, steps, batch, hidden, passes, layout, lens = _common(ctx, gates)
    acts = _activations(ctx, activations, len(passes))
    ys_all: list[list] = []
    finals: list[list] = [[] for _ in state_inputs]
    for d, reverse in enumerate(passes):
        w = _Weights(ctx, d, gates, hidden)
        xs = _project(ctx, x, w, steps)
        states = [_direction_state(ctx, i, d, batch, hidden, layout) for i in state_inputs]
        step = cell(d, w, acts[d])
        ys = [None] * steps
        for t in _order(reverse, steps):
            new = step(xs[t], states)
            ys[t] = _masked(ctx, lens, t, new[0], None, True)
            states = [_masked(ctx, lens, t, n, old) for n, old in zip(new, states)]
        ys_all.append(ys)
        for k, state in enumerate(states):
            finals[k].append(state)
    return _outputs(ctx, ys_all, finals, layout)


@converter("RNN")
def rnn(ctx: Context) -> list:
    """``H = f(X W^T + H R^T + Wb + Rb)``."""

    def cell(d: int, w: _Weights, acts: list) -> Callable:
        def step(x_t, states):
            return [acts[0](_clip(ctx, _recurrence(ctx, x_t, states[0], w)))]
        return step

    return _unrolled(ctx, 1, ["Tanh"], (5,), cell)


@converter("GRU")
def gru(ctx: Context) -> list:
    """Gates z, r, h; ``linear_before_reset`` applies R_h before the reset gate."""
    b = ctx.b
    linear_before_reset = bool(ctx.attr("linear_before_reset", 0))

    def cell(d: int, w: _Weights, acts: list) -> Callable:
        f, g = acts
        rz_r, rr_r, rh_r = b.split(w.r, indices_or_sections=3, axis=1)
        rzr = b.concatenate(rz_r, rr_r, axis=1)
        if w.rb is not None:
            rbz, rbr, rbh = b.split(w.rb, indices_or_sections=3, axis=0)
            rbzr = b.concatenate(rbz, rbr, axis=0)

        def step(x_t, states):
            (h,) = states
            xz, xr, xh = b.split(x_t, indices_or_sections=3, axis=-1)
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
            return [n + z * (h - n)]  # (1 - z) * n + z * h

        return step

    return _unrolled(ctx, 3, ["Sigmoid", "Tanh"], (5,), cell)


@converter("LSTM")
def lstm(ctx: Context) -> list:
    """Gates i, o, f, c; peepholes P (i, o, f); ``input_forget`` couples f = 1 - i."""
    b = ctx.b
    input_forget = bool(ctx.attr("input_forget", 0))
    dt = np.dtype(ctx.dtype(0))

    def peepholes(d: int, hidden: int) -> list | None:
        """Direction ``d``'s peephole weights P_i, P_o, P_f (None: none)."""
        if not ctx.has_input(7):
            return None
        const = ctx.constant(7)
        if const is not None and const.dtype != object:
            p = np.asarray(const)[d].astype(dt)
            if not np.any(p):
                return None
            return [_import(ctx, f"{ctx.node.input[7]}.P{d}{k}", p[k * hidden:(k + 1) * hidden])
                    for k in range(3)]
        pv = b.squeeze(b.slice(ctx.input(7), lengths=[1, 3 * hidden], starts=[d, 0]), axes=[0])
        return list(b.split(pv, indices_or_sections=3, axis=0))

    def cell(d: int, w: _Weights, acts: list) -> Callable:
        f, g, hact = acts
        peep = peepholes(d, w.hidden)

        def step(x_t, states):
            h, c = states
            pre = _recurrence(ctx, x_t, h, w)
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
            return [o * hact(c_new), c_new]

        return step

    return _unrolled(ctx, 4, ["Sigmoid", "Tanh", "Tanh"], (5, 6), cell)
