"""Varying-length calls of a symbolic program: traces and total time with and
without bucketing, and for a shape-polymorphic (shapeless) program.

A prefill-like program (x[T, 64] @ w, tanh, a T-dependent reshape, a masked
mean using the true length) is called with a sequence of lengths drawn from
[1, 256]; each configuration sees the same sequence in one run.

Run: python benchmarks/bench_symbolic.py [--calls 120] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx
import numpy as np

import mlxprog as mp

WIDTH = 64


def prefill_program() -> mp.Program:
    return mp.Program.from_dict({
        "format": "mlxprog", "version": 1, "name": "prefill",
        "dims": {"T": {"min": 1, "max": 256}},
        "inputs": [{"name": "x", "shape": ["T", WIDTH], "dtype": "float32"},
                   {"name": "length", "shape": [], "dtype": "int32", "value_of": "T"}],
        "captures": [{"name": "w", "shape": [WIDTH, WIDTH], "dtype": "float32"}],
        "instructions": [
            {"op": "matmul", "operands": [{"input": 0}, {"capture": 0}]},
            {"op": "tanh", "operands": [{"result": 0}]},
            {"op": "reshape", "operands": [{"result": 1}], "attrs": {"shape": ["T*64"]}},
            {"op": "sum", "operands": [{"result": 1}], "attrs": {"axes": [0]}},
            {"op": "astype", "operands": [{"input": 1}], "attrs": {"dtype": "float32"}},
            {"op": "divide", "operands": [{"result": 3}, {"result": 4}]},
        ],
        "outputs": [{"result": 2}, {"result": 5}],
    })


def shapeless_program() -> mp.Program:
    data = prefill_program().to_dict()
    data["instructions"] = data["instructions"][:2] + [
        {"op": "multiply", "operands": [{"result": 1}, {"input": 0}]},
        {"op": "sum", "operands": [{"result": 2}], "attrs": {"axes": [0]}},
    ]
    data["outputs"] = [{"result": 3}]
    return mp.Program.from_dict(data)


def run(exe: mp.Executable, inputs: list[np.ndarray]) -> float:
    start = time.perf_counter()
    for x in inputs:
        mx.eval(exe(x))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    lengths = rng.integers(1, 257, size=args.calls)
    inputs = [mx.array(rng.normal(size=(int(t), WIDTH)).astype(np.float32)) for t in lengths]
    w = {"w": rng.normal(size=(WIDTH, WIDTH)).astype(np.float32) / 8}
    configs = {
        "per-length traces": mp.compile(prefill_program(), captures=w, max_traces=256),
        "buckets pow2": mp.compile(prefill_program(), captures=w, buckets={"T": "pow2"}),
        "buckets [64,128,256]": mp.compile(prefill_program(), captures=w,
                                           buckets={"T": [64, 128, 256]}),
        "shapeless program": mp.compile(shapeless_program(), captures=w),
    }
    print(f"{args.calls} calls, {len(set(lengths.tolist()))} distinct lengths in [1, 256]")
    print(f"{'configuration':24s} {'total s':>9s} {'ms/call':>9s} {'traces':>7s} {'trace s':>8s}")
    for name, exe in configs.items():
        total = run(exe, inputs)
        again = run(exe, inputs)  # the same sequence again: everything is cached
        print(f"{name:24s} {total:9.3f} {1e3 * total / args.calls:9.2f} "
              f"{exe.stats.traces:7d} {exe.stats.trace_seconds:8.3f}   "
              f"(second pass {1e3 * again / args.calls:.2f} ms/call)")


if __name__ == "__main__":
    main()
