"""One transformer block's decode step with a fixed-size KV cache (issue 4).

The step: RMS norm, q/k/v projections, RoPE at the cache offset,
``kv_cache_sdpa_update`` (grouped-query attention over a ``[B, H_kv, T_max, D]``
cache), output projection and residual, RMS norm, SwiGLU MLP and residual.

- ``program``: the step built with ``ProgramBuilder`` from mlxprog ops,
  run by its Executable (``mlxprog.compile``);
- ``hand``:    the same step written directly in MLX, ``mx.compile``d.

Both take the offset as an int32 array that advances every step, so neither
retraces. Each repetition decodes ``--steps`` tokens from offset 0 with the two
sides in lockstep (one step of each in turn, alternating which goes first),
evaluating every step as a decode loop must to pick the next token; the median
over all timed steps is reported.

    python benchmarks/bench_decode_block.py [--reps 15] [--steps 64] [--dtype float32]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import mlx.core as mx

import mlxprog as mp

DIM, HEADS, KV_HEADS, HEAD_DIM, HIDDEN, T_MAX = 1024, 16, 4, 64, 2816, 512
EPS, ROPE_BASE = 1e-5, 10000.0

WEIGHT_SHAPES = {
    "attn_norm": (DIM,),
    "wq": (DIM, HEADS * HEAD_DIM),
    "wk": (DIM, KV_HEADS * HEAD_DIM),
    "wv": (DIM, KV_HEADS * HEAD_DIM),
    "wo": (HEADS * HEAD_DIM, DIM),
    "mlp_norm": (DIM,),
    "w_gate": (DIM, HIDDEN),
    "w_up": (DIM, HIDDEN),
    "w_down": (HIDDEN, DIM),
}
CACHE_SHAPE = (1, KV_HEADS, T_MAX, HEAD_DIM)


def weights(dtype: mx.Dtype) -> dict[str, mx.array]:
    key = mx.random.key(0)
    out = {}
    for name, shape in WEIGHT_SHAPES.items():
        key, sub = mx.random.split(key)
        scale = 1.0 if len(shape) == 1 else shape[0] ** -0.5
        out[name] = (mx.random.normal(shape, key=sub) * scale).astype(dtype)
    return out


def build_program(dtype: str) -> mp.Program:
    """The decode step as a program: inputs x, offset, k_cache, v_cache;
    outputs the block's output and the updated caches."""
    b = mp.ProgramBuilder("decode_block")
    x = b.input("x", (1, 1, DIM), dtype)
    offset = b.input("offset", (), "int32")
    k_cache = b.input("k_cache", CACHE_SHAPE, dtype)
    v_cache = b.input("v_cache", CACHE_SHAPE, dtype)
    w = {name: b.capture(name, shape, dtype) for name, shape in WEIGHT_SHAPES.items()}

    def heads(t, n):  # [1, 1, n * D] -> [1, n, 1, D]
        return b.transpose(b.reshape(t, shape=[1, 1, n, HEAD_DIM]), axes=[0, 2, 1, 3])

    def rope(t):
        return b.fast_rope(t, offset, dims=HEAD_DIM, base=ROPE_BASE)

    h = b.fast_rms_norm(x, w["attn_norm"], eps=EPS)
    q = rope(heads(h @ w["wq"], HEADS))
    k = rope(heads(h @ w["wk"], KV_HEADS))
    v = heads(h @ w["wv"], KV_HEADS)
    attn, k_cache, v_cache = b.kv_cache_sdpa_update(
        q, k, v, k_cache, v_cache, offset, layout="BHTD")
    attn = b.reshape(b.transpose(attn, axes=[0, 2, 1, 3]), shape=[1, 1, HEADS * HEAD_DIM])
    x = x + attn @ w["wo"]
    h = b.fast_rms_norm(x, w["mlp_norm"], eps=EPS)
    x = x + b.fast_swiglu(h @ w["w_gate"], h @ w["w_up"]) @ w["w_down"]
    return b.build([x, k_cache, v_cache])


def hand_written(w: dict[str, mx.array]):
    """The same step in plain MLX, compiled; weights are closed over, as the
    Executable closes over its captures."""
    scale = HEAD_DIM**-0.5

    def heads(t, n):
        return t.reshape(1, 1, n, HEAD_DIM).transpose(0, 2, 1, 3)

    def rope(t, offset):
        return mx.fast.rope(t, HEAD_DIM, traditional=False, base=ROPE_BASE, scale=1.0,
                            offset=offset)

    def step(x, offset, k_cache, v_cache):
        h = mx.fast.rms_norm(x, w["attn_norm"], EPS)
        q = rope(heads(h @ w["wq"], HEADS), offset)
        k = rope(heads(h @ w["wk"], KV_HEADS), offset)
        v = heads(h @ w["wv"], KV_HEADS)
        start = offset.reshape(1)
        k_cache = mx.slice_update(k_cache, k, start, axes=(2,))
        v_cache = mx.slice_update(v_cache, v, start, axes=(2,))
        mask = mx.arange(T_MAX) <= offset
        attn = mx.fast.scaled_dot_product_attention(q, k_cache, v_cache, scale=scale, mask=mask)
        x = x + attn.transpose(0, 2, 1, 3).reshape(1, 1, HEADS * HEAD_DIM) @ w["wo"]
        h = mx.fast.rms_norm(x, w["mlp_norm"], EPS)
        gate = h @ w["w_gate"]
        return x + (gate * mx.sigmoid(gate) * (h @ w["w_up"])) @ w["w_down"], k_cache, v_cache

    return mx.compile(step)


def decode(sides: dict, xs, offsets, dtype, times: dict[str, list[float]] | None = None):
    """Decode len(offsets) tokens from empty caches with every side in lockstep
    (alternating which goes first), appending each step's seconds to ``times``.
    Returns each side's last outputs."""
    caches = {name: (mx.zeros(CACHE_SHAPE, dtype), mx.zeros(CACHE_SHAPE, dtype)) for name in sides}
    mx.eval(caches)
    outputs = {}
    names = list(sides)
    for i, (x, offset) in enumerate(zip(xs, offsets)):
        for name in names if i % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            out, k_cache, v_cache = sides[name](x, offset, *caches[name])
            mx.eval(out, k_cache, v_cache)
            if times is not None:
                times[name].append(time.perf_counter() - start)
            caches[name] = (k_cache, v_cache)
            outputs[name] = (out, k_cache, v_cache)
    return outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    args = parser.parse_args()
    dtype = getattr(mx, args.dtype)

    w = weights(dtype)
    exe = mp.compile(build_program(args.dtype), captures=w)
    sides = {"program": exe, "hand": hand_written(w)}
    xs = [mx.random.normal((1, 1, DIM), key=mx.random.key(i)).astype(dtype)
          for i in range(args.steps)]
    offsets = [mx.array(i, mx.int32) for i in range(args.steps)]
    mx.eval(xs, offsets, w)

    # Warm up (trace, JIT), and check that both sides compute the same step.
    results = decode(sides, xs, offsets, dtype)
    tol = 1e-3 if dtype == mx.float32 else 5e-2
    for got, want in zip(results["program"], results["hand"]):
        assert mx.allclose(got, want, rtol=tol, atol=tol).item(), "program != hand-written"

    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.reps):
        decode(sides, xs, offsets, dtype, times)
    assert exe.stats.traces == 1, f"the program retraced: {exe.stats}"

    median = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    print(f"mlx {mx.__version__}, {platform.machine()}, device {mx.default_device()}, "
          f"{args.dtype}; dim {DIM}, heads {HEADS}/{KV_HEADS} x {HEAD_DIM}, mlp {HIDDEN}, "
          f"cache {T_MAX}; {args.reps} reps x {args.steps} steps")
    print(f"{'side':<8} {'ms/token':>9}")
    for name, ms in median.items():
        print(f"{name:<8} {ms:9.3f}")
    print(f"ratio program/hand: {median['program'] / median['hand']:.3f} "
          f"(traces: program {exe.stats.traces})")


if __name__ == "__main__":
    main()
