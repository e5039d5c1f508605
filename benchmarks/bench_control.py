"""Host-boundary overhead: ``while`` iterations and ``runtime_call`` boundaries.

Measures, side by side in one run (interleaved rounds, medians):
  * per-iteration time of a ``while`` program versus a hand-written Python loop
    over ``mx.compile``d cond and body functions doing the same ops;
  * per-call time of a program split by a ``runtime_call`` versus the same
    two compiled halves and callback called by hand, and versus the program
    without the boundary.

Run: python benchmarks/bench_control.py [--iterations 200] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np

import mlxprog as mp

WIDTH = 16


def loop_program() -> mp.Program:
    b = mp.ProgramBuilder("loop")
    x = b.input("x", (WIDTH,), "float32")
    n = b.input("n", (), "int32")
    out, _ = b.while_loop(
        lambda sb, v, i: sb.less(i, n),
        lambda sb, v, i: (sb.tanh(v * 0.5 + 0.1), i + 1),
        [x, b.constant(0, "int32")],
    )
    return b.build([out])


def hand_loop():
    cond = mx.compile(lambda i, n: i < n)
    body = mx.compile(lambda v, i: (mx.tanh(v * 0.5 + 0.1), i + 1))

    def run(x, n):
        i = mx.array(0, dtype=mx.int32)
        pred = cond(i, n)
        while pred.item():
            x, i = body(x, i)
            pred = cond(i, n)
            mx.eval(pred, x, i)
        return x

    return run


def callback_programs():
    def build(with_boundary: bool) -> mp.Program:
        b = mp.ProgramBuilder("boundary" if with_boundary else "straight")
        x = b.input("x", (WIDTH,), "float32")
        y = b.exp(x) * 0.5
        if with_boundary:
            (y,) = b.runtime_call("identity", [y], [((WIDTH,), "float32")])
        return b.build([b.tanh(y) + 1.0])

    return build(True), build(False)


def hand_boundary():
    first = mx.compile(lambda x: mx.exp(x) * 0.5)
    second = mx.compile(lambda y: mx.tanh(y) + 1.0)

    def run(x):
        return second(identity(first(x)))

    return run


def identity(v):
    return v


def timed(fn, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        mx.eval(fn())
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200, help="loop trip count")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200, help="calls per round (boundary)")
    args = parser.parse_args()

    x = mx.array(np.linspace(-1, 1, WIDTH, dtype=np.float32))
    n = mx.array(args.iterations, dtype=mx.int32)
    loop_exe = mp.compile(loop_program())
    loop_hand = hand_loop()
    np.testing.assert_allclose(np.array(loop_exe(x, n)[0]), np.array(loop_hand(x, n)), rtol=1e-6)

    with_cb, without_cb = callback_programs()
    cb_exe = mp.compile(with_cb, callbacks={"identity": identity})
    straight_exe = mp.compile(without_cb)
    cb_hand = hand_boundary()

    loop_times = {"mlxprog while": [], "hand-written loop": []}
    call_times = {"mlxprog runtime_call": [], "hand-written split": [], "mlxprog no boundary": []}
    for _ in range(args.rounds):
        loop_times["mlxprog while"].append(timed(lambda: loop_exe(x, n), 1) / args.iterations)
        loop_times["hand-written loop"].append(timed(lambda: loop_hand(x, n), 1) / args.iterations)
        call_times["mlxprog runtime_call"].append(timed(lambda: cb_exe(x), args.calls))
        call_times["hand-written split"].append(timed(lambda: cb_hand(x), args.calls))
        call_times["mlxprog no boundary"].append(timed(lambda: straight_exe(x), args.calls))

    def report(title, times, base):
        print(title)
        medians = {k: statistics.median(v) for k, v in times.items()}
        for name, value in medians.items():
            print(f"  {name:24s} {value * 1e6:9.2f} us   ratio vs {base}: "
                  f"{value / medians[base]:.3f}")
        return medians

    loops = report(f"while loop, per iteration ({args.iterations} iterations/call)",
                   loop_times, "hand-written loop")
    calls = report("runtime_call boundary, per call", call_times, "hand-written split")
    boundary = calls["mlxprog runtime_call"] - calls["mlxprog no boundary"]
    print(f"  cost of one runtime_call boundary: {boundary * 1e6:.2f} us per call")
    ratio = loops["mlxprog while"] / loops["hand-written loop"]
    print(f"target: while within 1.20x of hand-written -> {ratio:.3f}x "
          f"{'OK' if ratio <= 1.2 else 'MISSED'}")


if __name__ == "__main__":
    main()
