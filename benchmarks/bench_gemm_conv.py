"""float32 matmul and convolution: MLX's CPU ops against mlxprog's native
kernels (mlxprog/native/src/kernels/*/gemm.h) and numpy (its BLAS), in GFLOP/s
(median of --runs calls after a warm-up); then the exact int32 matmul
(``--int-size`` square; mlxprog/native/src/kernels/*/int_matmul.h) against
numpy and the float64-pieces path it replaces, in seconds. The native
kernels use MLXPROG_NATIVE_THREADS threads (default: the usable cores);
numpy its BLAS's own threads. On a shared machine, re-run and compare
medians.

    python benchmarks/bench_gemm_conv.py [--runs 5] [--int-size 1500]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np

from mlxprog import native
from mlxprog.native import kernels
from mlxprog.ops.contract import _integer_matmul

MATMULS = [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (196, 2304, 256),
           (1, 25088, 4096)]
"""(M, K, N); the last two: a ResNet 14x14 3x3 layer's GEMM, VGG's first
fully connected layer (one row: bound by reading the weight)."""

CONVS = [((1, 224, 224, 3), (64, 7, 7, 3), 2, 3), ((1, 56, 56, 64), (64, 3, 3, 64), 1, 1),
         ((1, 56, 56, 256), (64, 1, 1, 256), 1, 0), ((1, 14, 14, 256), (256, 3, 3, 256), 1, 1),
         ((1, 112, 112, 128), (128, 3, 3, 128), 1, 1)]
"""(input, weight, stride, padding) of ResNet-50 and VGG-19 layers."""


def seconds(fn, runs: int) -> float:
    """Median wall time of ``fn()`` (evaluated) over ``runs`` calls."""
    mx.eval(fn())
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    """Print one line per case: GFLOP/s of MLX, native and (matmul) numpy."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mlx-runs", type=int, default=1,
                        help="timed calls of MLX's (slow) ops")
    parser.add_argument("--int-size", type=int, default=1500,
                        help="N of the int32 N x N matmul (0: skip it)")
    args = parser.parse_args()
    ext = native.module()
    if ext is None:
        raise SystemExit(f"native kernels unavailable: {native.status()}")
    print(f"native: {native.status()}")
    rng = np.random.default_rng(0)
    for M, K, N in MATMULS:
        a_np = rng.standard_normal((M, K)).astype(np.float32)
        b_np = rng.standard_normal((N, K)).astype(np.float32).T  # weights as (N, K)
        a, b = mx.array(a_np), mx.array(np.ascontiguousarray(b_np.T)).T
        flops = 2 * M * K * N
        rates = {
            "mlx": flops / seconds(lambda: mx.matmul(a, b), args.mlx_runs),
            "native": flops / seconds(lambda: ext.matmul(a, b), args.runs),
        }
        start = time.perf_counter()
        for _ in range(args.runs):
            a_np @ b_np
        rates["numpy"] = flops * args.runs / (time.perf_counter() - start)
        print(f"matmul {M}x{K}x{N} (B transposed): " +
              "  ".join(f"{k} {v / 1e9:6.1f}" for k, v in rates.items()) + " GFLOP/s")
    for x_shape, w_shape, stride, pad in CONVS:
        x = mx.array(rng.standard_normal(x_shape).astype(np.float32))
        w = mx.array(rng.standard_normal(w_shape).astype(np.float32))
        out = ext.conv(x, w, stride=[stride] * 2, pad_low=[pad] * 2, pad_high=[pad] * 2,
                       dilation=[1, 1], groups=1)
        flops = 2 * out.size * int(np.prod(w_shape[1:]))
        mlx = seconds(lambda: mx.conv_general(x, w, stride=stride, padding=pad), args.mlx_runs)
        nat = seconds(lambda: ext.conv(x, w, stride=[stride] * 2, pad_low=[pad] * 2,
                                       pad_high=[pad] * 2, dilation=[1, 1], groups=1), args.runs)
        print(f"conv {list(x_shape)} * {list(w_shape)} stride {stride} pad {pad}: "
              f"mlx {flops / mlx / 1e9:6.1f}  native {flops / nat / 1e9:6.1f} GFLOP/s")
    if args.int_size:
        integer_matmul(rng, args.int_size)


def integer_matmul(rng: np.random.Generator, n: int) -> None:
    """Print the seconds of one exact int32 n x n product three ways (the
    results checked equal)."""
    a_np = rng.integers(-2**31, 2**31, (n, n), dtype=np.int64).astype(np.int32)
    b_np = rng.integers(-2**31, 2**31, (n, n), dtype=np.int64).astype(np.int32)
    a, b = mx.array(a_np), mx.array(b_np)
    setting = native.Setting(enabled=True)
    timings, results = {}, []
    for name, fn in [("numpy", lambda: a_np @ b_np),
                     ("native", lambda: np.array(kernels.integer_matmul(setting, a, b))),
                     ("float64 pieces", lambda: np.array(_integer_matmul(a, b, mx.int32)))]:
        start = time.perf_counter()
        results.append(fn())
        timings[name] = time.perf_counter() - start
    if any(not np.array_equal(r, results[0]) for r in results[1:]):
        raise SystemExit("the integer products disagree")
    print(f"int32 matmul {n}x{n}: " + "  ".join(f"{k} {v:.2f} s" for k, v in timings.items()))


if __name__ == "__main__":
    main()
