"""Per-kernel speed: mlxprog's native CPU kernels against MLX's own ops, on
the shapes of a SmolLM2-135M decode step (M=1), a decode step of a batch of
four sequences (M=4) and of a 42-token prefill; then the quantized matmul's
int8 numerics against its exact ones.

Each case compiles a function that applies the op to ``--layers`` distinct
weight sets (so weights come from memory as in a real step, not from the
cache of the previous call), then times it interleaved with MLX's op,
best of ``--rounds`` rounds; the ratio is MLX time / native time.

    python benchmarks/bench_native.py [--rounds 5] [--layers 10]
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import mlx.core as mx

from mlxprog import native


def best_time(fn: Callable, rounds: int, calls: int = 10) -> float:
    """Seconds per call of a compiled ``fn`` (best of ``rounds``)."""
    compiled = mx.compile(fn)
    mx.eval(compiled())
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            mx.eval(compiled())
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def qmm_case(ext, rows: int, n: int, k: int, bits: int, layers: int):
    """The native kernel in exact and int8 numerics and MLX's op over
    ``layers`` weight sets, and the bytes of weights one call reads."""
    weights = [mx.quantize(mx.random.normal((n, k)) * 0.05, group_size=32, bits=bits)
               for _ in range(layers)]
    x = mx.random.normal((1, rows, k))
    mx.eval(weights, x)
    nat = lambda: [ext.quantized_matmul(x, w, s, b, transpose=True, group_size=32, bits=bits)
                   for w, s, b in weights]
    int8 = lambda: [ext.quantized_matmul(x, w, s, b, transpose=True, group_size=32, bits=bits,
                                         int8=True) for w, s, b in weights]
    ref = lambda: [mx.quantized_matmul(x, w, s, b, group_size=32, bits=bits)
                   for w, s, b in weights]
    bytes_read = layers * sum(a.nbytes for a in weights[0])
    return nat, int8, ref, bytes_read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=10)
    args = parser.parse_args()
    state = native.status()
    if not state.available:
        raise SystemExit(f"native kernels unavailable: {state.reason}")
    ext = native.module()
    L = args.layers
    print(f"native kernels: {state} | mlx {mx.__version__} | {L} layers per call, "
          f"best of {args.rounds}")
    print()
    print("| kernel | shape | MLX (us/layer) | native (us/layer) | MLX / native | native GB/s |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")

    def row(name, shape, nat, ref, bytes_read=None, layers=L):
        # Interleave: MLX, native, MLX, native... keep the best of each.
        t_ref = t_nat = float("inf")
        for _ in range(2):
            t_ref = min(t_ref, best_time(ref, args.rounds))
            t_nat = min(t_nat, best_time(nat, args.rounds))
        rate = f"{bytes_read / t_nat / 1e9:.1f}" if bytes_read else ""
        print(f"| {name} | {shape} | {t_ref / layers * 1e6:.0f} | {t_nat / layers * 1e6:.1f} | "
              f"{t_ref / t_nat:.1f}x | {rate} |")

    qmm_shapes = ((576, 576, 4), (192, 576, 4), (1536, 576, 4), (576, 1536, 4),
                  (49152, 576, 8))
    int8_rows = []
    for rows in (1, 4, 42):
        for n, k, bits in qmm_shapes:
            layers = L if n < 10000 else 2  # the LM head: two copies are plenty
            nat, int8, ref, nbytes = qmm_case(ext, rows, n, k, bits, layers)
            row(f"quantized_matmul {bits}-bit g32", f"M={rows} N={n} K={k}", nat, ref, nbytes,
                layers)
            int8_rows.append((f"quantized_matmul {bits}-bit g32 int8", f"M={rows} N={n} K={k}",
                              int8, nat, nbytes, layers))

    for rows in (1, 42):
        x = mx.random.normal((1, rows, 576))
        ws = [mx.random.normal((576,)) for _ in range(L)]
        mx.eval(x, ws)
        row("fast_rms_norm", f"[1, {rows}, 576]",
            lambda: [ext.rms_norm(x, w, eps=1e-5) for w in ws],
            lambda: [mx.fast.rms_norm(x, w, 1e-5) for w in ws])
        qs = [mx.random.normal((1, 9, rows, 64)) for _ in range(L)]
        off = mx.array([7], mx.int32)
        mx.eval(qs)
        row("fast_rope", f"[1, 9, {rows}, 64]",
            lambda: [ext.rope(q, off, dims=64, traditional=False, base=100000.0, scale=1.0)
                     for q in qs],
            lambda: [mx.fast.rope(q, 64, traditional=False, base=100000.0, scale=1.0,
                                  offset=off) for q in qs])
    for rows, start, slots in ((1, 200, 256), (1, 1000, 1024), (42, 0, 128)):
        q = mx.random.normal((1, 9, rows, 64))
        caches = [(mx.random.normal((1, 3, slots, 64)), mx.random.normal((1, 3, slots, 64)))
                  for _ in range(L)]
        mask = mx.ones((1, slots), mx.bool_)
        st = mx.array([start], mx.int32)
        mx.eval(q, caches, mask)
        keep = (mx.arange(slots) <= mx.arange(rows)[:, None] + start) & mask[:, None, None, :]

        def reference(q=q, caches=caches, keep=keep):
            outs = []
            for k, v in caches:
                o = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=keep)
                outs.append(mx.where(mx.any(keep, axis=-1, keepdims=True), o, 0.0))
            return outs

        row("cache attention", f"q [1, 9, {rows}, 64], cache {slots}, at {start}",
            lambda q=q, caches=caches, st=st: [ext.cache_attention(q, k, v, st, mask, scale=0.125)
                                                for k, v in caches],
            reference)

    # The quantized matmul's int8 numerics against its exact ones (both native).
    print()
    print("| kernel | shape | exact (us/layer) | int8 (us/layer) | exact / int8 | int8 GB/s |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for name, shape, int8, exact, nbytes, layers in int8_rows:
        row(name, shape, int8, exact, nbytes, layers)


if __name__ == "__main__":
    main()
