"""One decode step of SmolLM2-135M-Instruct (Q4_1 GGUF) for a batch of B
sequences: milliseconds per step and tokens per second for B = 1, 2, 4, 8,
with mlxprog's native kernels and with MLX's own ops, side by side. The step
is the logits program generation runs (``LLM.executable("decode")``), on
caches of ``--width`` slots; best of ``--rounds`` rounds of ``--steps`` steps.
The ratio ``tok/s vs B=1`` is what continuous batching can gain at most.

    python benchmarks/bench_batch_step.py [--batches 1,2,4,8] [--width 128] [--steps 10]
                                          [--rounds 3] [--no-mlx-ops]
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx

from mlxprog.llm import LLM, load_checkpoint
from mlxprog.llm.model_files import default_model_path
from mlxprog.llm.programs import DecodeInputs, LogitsOutputs


def step_seconds(llm: LLM, batch: int, width: int, steps: int, rounds: int) -> float:
    """Seconds per decode step of ``batch`` rows over ``width`` cache slots."""
    decode = llm.executable("decode", None)
    caches = llm.cache_layout.empty(batch, width)
    position = width // 2
    fixed = dict(tokens=mx.zeros((batch,), mx.int32),
                 rope_offset=mx.full((batch,), position, mx.int32),
                 cache_offset=mx.array(position, mx.int32),
                 key_mask=mx.ones((batch, width), mx.bool_), key=mx.random.key(0))

    def run(n: int) -> None:
        nonlocal caches
        for _ in range(n):
            out = LogitsOutputs.of(decode(**DecodeInputs(caches=caches,
                                                         **fixed).by_name(llm.cache_layout)))
            caches = out.caches
            mx.eval(out.values())

    run(2)  # trace and warm up
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        run(steps)
        best = min(best, (time.perf_counter() - start) / steps)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,2,4,8")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-mlx-ops", action="store_true", help="skip MLX's own ops")
    args = parser.parse_args()
    checkpoint = load_checkpoint(default_model_path())
    kinds = {"native": True} if args.no_mlx_ops else {"native": True, "MLX ops": False}
    llms = {name: LLM(checkpoint, max_length=max(args.width, 2), native=flag)
            for name, flag in kinds.items()}
    batches = [int(b) for b in args.batches.split(",")]
    print(f"decode step, cache {args.width} slots, best of {args.rounds} x {args.steps} steps\n")
    print("| B | " + " | ".join(f"{n} ms/step | {n} tok/s | {n} tok/s vs B=1" for n in kinds)
          + " |")
    print("| ---: |" + " ---: | ---: | ---: |" * len(kinds))
    single: dict[str, float] = {}
    for batch in batches:
        cells = []
        for name, llm in llms.items():
            seconds = step_seconds(llm, batch, args.width, args.steps, args.rounds)
            tps = batch / seconds
            single.setdefault(name, tps)
            cells.append(f"{seconds * 1e3:.1f} | {tps:.1f} | {tps / single[name]:.2f}x")
        print(f"| {batch} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
