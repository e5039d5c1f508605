"""The decode step's MLX graph on SmolLM2-135M-Instruct (issue 20): how many
nodes a step evaluates, how long the host takes to build and dispatch it,
and the decode speed.

- **nodes**: ``exe.stats.segments[i].nodes`` of the decode executable (the
  compiled tape, counted when it is traced), with the most frequent
  primitives;
- **host ms / step**: the Python call to the decode executable (it returns
  lazy outputs: the compiled graph replayed for this step's inputs), and
  the main thread's CPU time (``time.thread_time``) of that call plus
  ``mx.async_eval`` of the logits and caches (MLX's dispatch of every node
  to the CPU stream: it runs only a few nodes ahead of the stream, so its
  wall time is mostly waiting for the step, also shown), per step of a
  greedy loop that, like the engine, reads a step's token only after the
  next step is dispatched; medians over the steps;
- **decode tok/s**: ``LLM.generate`` on the benchmark prompt, median of
  ``--runs``; the greedy token ids are printed (first and last few) so
  runs of two trees can be compared.

    python benchmarks/decode_graph.py [--steps 64] [--runs 3] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time

import mlx.core as mx

import mlxprog.llm
from mlxprog.llm.engine import prefill_bucket
from mlxprog.llm.programs import DecodeInputs, LogitsOutputs, PrefillInputs

PROMPT = "Write a short story about a robot who learns to paint."


def host_times(llm: mlxprog.llm.LLM, ids: list[int],
               steps: int) -> tuple[list[float], list[float], list[float]]:
    """Per decode step of ``steps`` greedy steps after prefilling ``ids``
    into caches of 128 slots: the seconds the call to the decode executable
    takes (building the step's graph), the main thread's CPU seconds of the
    call and ``mx.async_eval`` together (MLX's CPU stream lets the main
    thread run only a few nodes ahead of it, so async_eval's wall time is
    mostly waiting), and the wall seconds of the call and async_eval."""
    layout, slots = llm.cache_layout, 128
    caches = layout.empty(1, slots)
    chunk = prefill_bucket(len(ids))
    key, key_mask = mx.random.key(0), mx.ones((1, slots), dtype=mx.bool_)
    out = LogitsOutputs.of(llm.executable("prefill", None)(**PrefillInputs(
        tokens=mx.array([ids + [0] * (chunk - len(ids))], dtype=mx.int32),
        last_index=mx.array([len(ids) - 1], dtype=mx.int32),
        rope_offset=mx.array([0], dtype=mx.int32), cache_offset=mx.array(0, dtype=mx.int32),
        key_mask=key_mask, key=key, caches=caches).by_name(layout)))
    token = mx.argmax(out.logits, axis=-1).astype(mx.int32)
    caches, offset = out.caches, len(ids)
    mx.eval(token, caches)
    decode = llm.executable("decode", None)
    calls, cpu, walls = [], [], []
    previous = None
    for _ in range(steps):
        inputs = DecodeInputs(tokens=token, rope_offset=mx.array([offset], dtype=mx.int32),
                              cache_offset=mx.array(offset, dtype=mx.int32),
                              key_mask=key_mask, key=key, caches=caches).by_name(layout)
        start, start_cpu = time.perf_counter(), time.thread_time()
        out = LogitsOutputs.of(decode(**inputs))
        calls.append(time.perf_counter() - start)
        token = mx.argmax(out.logits, axis=-1).astype(mx.int32)
        mx.async_eval(token, *out.caches)
        cpu.append(time.thread_time() - start_cpu)
        walls.append(time.perf_counter() - start)
        caches, offset = out.caches, offset + 1
        if previous is not None:
            previous.item()  # the engine reads a step's token after dispatching the next
        previous = token
    mx.eval(caches)
    return calls, cpu, walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=64, help="decode steps timed for host time")
    parser.add_argument("--runs", type=int, default=3, help="generations timed for tok/s")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    llm = mlxprog.llm.load()
    ids = llm.prompt_ids(PROMPT)
    warm = llm.generate(ids, max_tokens=args.max_tokens)
    decode = llm.executable("decode", None)
    segment = decode.stats.segments[0]
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"decode program: {decode.stats.instructions} instructions, "
          f"{len(decode.stats.segments)} segment(s), nodes per step {segment.nodes}")
    top = sorted(segment.primitives.items(), key=lambda kv: -kv[1])
    print("  " + ", ".join(f"{name} {n}" for name, n in top))
    host_times(llm, ids, 8)  # warm-up: the engine's own traces
    calls, cpu, walls = host_times(llm, ids, args.steps)
    print(f"host ms / step, medians: call {statistics.median(calls) * 1e3:.3f}, "
          f"main-thread CPU of call + async_eval {statistics.median(cpu) * 1e3:.3f}, "
          f"wall of call + async_eval {statistics.median(walls) * 1e3:.3f}")
    rates = [llm.generate(ids, max_tokens=args.max_tokens).stats.decode_tps
             for _ in range(args.runs)]
    print(f"decode tok/s: median {statistics.median(rates):.2f} "
          f"({' '.join(f'{r:.2f}' for r in rates)})")
    tokens = list(warm.tokens)
    digest = hashlib.sha1(str(tokens).encode()).hexdigest()[:12]
    print(f"greedy tokens: {len(tokens)}, sha1 {digest}, {tokens[:6]} ... {tokens[-4:]}")


if __name__ == "__main__":
    main()
