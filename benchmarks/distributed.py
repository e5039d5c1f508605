"""Tensor-parallel decode of SmolLM2-135M-Instruct (Q4_1 GGUF) on 1, 2 (and
3) ranks of MLX's ring backend on loopback, side by side in one run.

For each world size the script launches itself with ``mlx.launch --backend
ring -n N`` (world size 1: a plain process on every core); each rank pins
itself to core ``rank % cores`` before MLX starts (ring ranks busy-poll
while they wait, so unpinned ranks on a small machine fight for the cores;
the native kernels' thread pool then uses the rank's one core), loads the
model with ``group=mx.distributed.init()`` (world size
1: the unsharded model) and reports, on rank 0:

- decode tok/s and TTFT of greedy generation (``--max-tokens`` tokens, best
  of ``--runs`` after one warm-up run), and the tokens themselves, which must
  equal world size 1's;
- the collective time of one decode step: a compiled function doing the
  step's ``2 x layers`` ``all_sum`` of one token's hidden state
  (``[1, 1, hidden]`` float32), timed alone.

    python benchmarks/distributed.py [--world-sizes 1,2] [--max-tokens 32] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PROMPT = "Write a short story about a robot who learns to paint."


def worker(args: argparse.Namespace) -> None:
    """One rank: pin, load, time, and (rank 0) print one JSON line."""
    if "MLX_RANK" in os.environ:  # launched as one of several ranks
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[int(os.environ["MLX_RANK"]) % len(cores)]})
    import mlx.core as mx

    import mlxprog.llm

    group = mx.distributed.init()
    llm = mlxprog.llm.load(max_length=512, group=group)
    llm.generate(PROMPT, max_tokens=4)  # trace the programs
    runs = [llm.generate(PROMPT, max_tokens=args.max_tokens) for _ in range(args.runs)]
    best = max(runs, key=lambda r: r.stats.decode_tps)
    hidden = llm.config.hidden_size
    x = mx.ones((1, 1, hidden))

    def collectives(x):
        for _ in range(2 * llm.config.num_layers):
            x = mx.distributed.all_sum(x, group=group) * (1.0 / group.size())
        return x

    step = mx.compile(collectives)
    mx.eval(step(x))
    start = time.perf_counter()
    for _ in range(20):
        mx.eval(step(x))
    collective_ms = (time.perf_counter() - start) / 20 * 1e3
    if group.rank() == 0:
        print(json.dumps({"world_size": group.size(), "decode_tps": best.stats.decode_tps,
                          "ttft": best.stats.ttft, "collective_ms": collective_ms,
                          "tokens": best.tokens}), flush=True)
    mx.clear_streams()


def launch(world_size: int, args: argparse.Namespace) -> dict:
    """Run the worker on ``world_size`` ranks; rank 0's report."""
    command = [sys.executable, __file__, "--worker", "--max-tokens", str(args.max_tokens),
               "--runs", str(args.runs)]
    if world_size > 1:
        command = ["mlx.launch", "--backend", "ring", "-n", str(world_size), "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout,
                          start_new_session=True)
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not reports:
        raise SystemExit(f"world size {world_size} failed ({done.returncode}):\n{done.stderr}")
    return reports[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-sizes", default="1,2")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    sizes = [int(n) for n in args.world_sizes.split(",")]
    cores = len(os.sched_getaffinity(0))
    print(f"SmolLM2 tensor-parallel decode, ring backend on loopback, {cores} cores: "
          f"1 rank on all of them, rank r of several pinned to core r % {cores}; greedy, "
          f"{args.max_tokens} tokens, best of {args.runs}\n")
    print("| ranks | decode tok/s | vs 1 rank | TTFT s | collectives per step ms | same tokens |")
    print("| ---: | ---: | ---: | ---: | ---: | --- |")
    base = None
    for n in sizes:
        report = launch(n, args)
        base = base or report
        print(f"| {n} | {report['decode_tps']:.1f} | "
              f"{report['decode_tps'] / base['decode_tps']:.2f}x | {report['ttft']:.2f} | "
              f"{report['collective_ms']:.2f} | {report['tokens'] == base['tokens']} |",
              flush=True)


if __name__ == "__main__":
    main()
