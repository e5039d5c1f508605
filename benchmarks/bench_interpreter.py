"""Interpreter overhead (issue 2).

Programs of N small elementwise instructions on tiny arrays, timed per call:

- ``exe``:   the Executable's compiled replay (``mlxprog.compile(prog)(x, y)``);
- ``hand``:  a hand-written ``mx.compile``d function doing the same ops;
- ``eager``: the same Executable interpreted eagerly (``eager=True``).

The three are interleaved in rounds (one call of each per round, cycling through
every order) and each time includes ``mx.eval`` of the outputs. Reported: the
median time of each, and the median of the per-round ratios.
Separately: ``Program.loads`` + ``validate`` of a large JSON program, best of 3.

    python benchmarks/bench_interpreter.py [--rounds 60] [--sizes 500 5000]
"""

from __future__ import annotations

import argparse
import itertools
import json
import operator
import platform
import statistics
import time

import mlx.core as mx

import mlxprog as mp

SHAPE = (4, 4)

# A repeating chain that mixes unary and binary ops and stays finite: every other
# op is bounded (sin, tanh, cos, sigmoid), the binary ops read the inputs or a
# value a few steps back (so the graph is a DAG, not just a chain).
PATTERN = [
    ("sin", mx.sin, ()),
    ("add", mx.add, ("x",)),
    ("tanh", mx.tanh, ()),
    ("multiply", mx.multiply, (-3,)),
    ("cos", mx.cos, ()),
    ("subtract", mx.subtract, ("y",)),
    ("sigmoid", mx.sigmoid, ()),
    ("max", mx.maximum, (-4,)),
]


def plan(n: int) -> list[tuple[str, object, list]]:
    """Step k: (op name, MLX function, operands) with operands "x", "y" or the
    index of an earlier step's result; step k's first operand is step k-1 (x
    for step 0)."""
    def earlier(k: int, offset: int | str):
        if isinstance(offset, str):
            return offset
        return k + offset if k + offset >= 0 else "y"

    steps = []
    for k in range(n):
        name, fn, extra = PATTERN[k % len(PATTERN)]
        operands = [k - 1 if k else "x", *(earlier(k, e) for e in extra)]
        steps.append((name, fn, operands))
    return steps


def program_json(n: int) -> str:
    """The program of ``plan(n)`` as format v1 JSON text."""
    def ref(operand):
        if isinstance(operand, str):
            return {"input": ("x", "y").index(operand)}
        return {"result": operand}

    return json.dumps({
        "format": "mlxprog", "version": 1, "name": f"chain{n}",
        "inputs": [{"name": "x", "shape": list(SHAPE), "dtype": "float32"},
                   {"name": "y", "shape": list(SHAPE), "dtype": "float32"}],
        "instructions": [{"op": name, "operands": [ref(o) for o in operands]}
                         for name, _, operands in plan(n)],
        "outputs": [{"result": n - 1}],
    })


def hand_written(n: int):
    """The same ops as plain MLX calls, compiled with ``mx.compile``. The Python
    body runs only while tracing, so looping over the plan replays exactly like
    straight-line code would."""
    steps = plan(n)

    def fn(x, y):
        inputs = {"x": x, "y": y}
        results = []
        for _, op, operands in steps:
            args = [inputs[o] if isinstance(o, str) else results[o] for o in operands]
            results.append(op(*args))
        return [results[-1]]

    return mx.compile(fn)


def time_call(fn, args) -> float:
    start = time.perf_counter()
    mx.eval(fn(*args))
    return time.perf_counter() - start


def bench_replay(n: int, rounds: int) -> dict:
    prog = mp.Program.loads(program_json(n))
    variants = {
        "exe": mp.compile(prog),
        "hand": hand_written(n),
        "eager": mp.compile(prog, eager=True),
    }
    args = (mx.random.uniform(-1, 1, SHAPE), mx.random.uniform(-1, 1, SHAPE))
    mx.eval(args)
    reference = variants["hand"](*args)[0]
    for name, fn in variants.items():  # trace (and build fused kernels) outside the timing
        out = fn(*args)[0]
        assert mx.allclose(out, reference, rtol=1e-4, atol=1e-5).item(), name
        assert mx.all(mx.isfinite(out)).item(), name
    # Each round calls every variant once; cycling through all orders makes each
    # variant follow each other one equally often.
    times: dict[str, list[float]] = {name: [] for name in variants}
    orders = itertools.cycle(itertools.permutations(variants))
    for _ in range(rounds):
        for name in next(orders):
            times[name].append(time_call(variants[name], args))
    assert variants["exe"].stats.traces == 1
    result = {name: statistics.median(t) for name, t in times.items()}
    # Ratios within a round compare calls made moments apart, so load from other
    # processes on the machine cancels out; their median is the reported ratio.
    result["exe/hand"] = statistics.median(map(operator.truediv, times["exe"], times["hand"]))
    result["eager/exe"] = statistics.median(map(operator.truediv, times["eager"], times["exe"]))
    return result


def bench_load(n: int, repeats: int = 3) -> dict:
    text = program_json(n)
    best = {"loads": float("inf"), "validate": float("inf"), "total": float("inf")}
    for _ in range(repeats):
        # Free the previous round's objects before the clock starts and keep
        # this round's until it stops: deallocation is not part of loading.
        prog = validated = None
        start = time.perf_counter()
        prog = mp.Program.loads(text)
        parsed = time.perf_counter()
        validated = mp.validate(prog)
        done = time.perf_counter()
        best["loads"] = min(best["loads"], parsed - start)
        best["validate"] = min(best["validate"], done - parsed)
        best["total"] = min(best["total"], done - start)
    best["megabytes"] = len(text) / 1e6
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60,
                        help="timed calls of each variant (default 60)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 5000],
                        help="instruction counts of the replay programs")
    parser.add_argument("--load-instructions", type=int, default=100_000,
                        help="instruction count of the load+validate program")
    args = parser.parse_args()

    print(f"mlx {mx.__version__}, mlxprog {mp.__version__}, Python {platform.python_version()}, "
          f"{platform.machine()}, device {mx.default_device()}; arrays float32{list(SHAPE)}; "
          f"{args.rounds} interleaved rounds, mx.eval included; times are medians, "
          "ratios medians of per-round ratios")
    print()
    print("| instructions | exe (ms) | hand (ms) | eager (ms) | exe / hand | eager / exe |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in args.sizes:
        t = bench_replay(n, args.rounds)
        print(f"| {n:,} | {t['exe'] * 1e3:.3f} | {t['hand'] * 1e3:.3f} | "
              f"{t['eager'] * 1e3:.2f} | {t['exe/hand']:.3f} | {t['eager/exe']:.1f} |",
              flush=True)
    print()
    load = bench_load(args.load_instructions)
    print(f"load + validate of {args.load_instructions:,} instructions "
          f"({load['megabytes']:.1f} MB JSON), best of 3: {load['total']:.3f} s "
          f"(Program.loads {load['loads']:.3f} s, validate {load['validate']:.3f} s)")


if __name__ == "__main__":
    main()
