"""``transformer_layer`` with GGML projections (``ggml_parts``): a layer
whose q/k/v and gate/up parts are of different GGML types, on the native
kernel (one graph node) against the same op on MLX's ops (the layer
composed of ``ggml_matmul`` and the attention block), over a few decode
steps; and the checks of its parts."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from ggml_blocks import blocks_with_std
from helpers import assert_invalid

import mlxprog as mp
from mlxprog.ggml import types as ggml_types

B, T, H, HKV, D, S, HIDDEN, WIDTH = 2, 3, 4, 2, 64, 16, 256, 512
PARTS = (("Q5_0", "Q4_K", "Q8_0"), ("IQ4_XS",), ("Q6_K", "Q5_1"), ("Q3_K",))
ROWS = {"qkv": (H * D, HKV * D, HKV * D), "o": (HIDDEN,), "gate_up": (WIDTH, WIDTH),
        "down": (HIDDEN,)}
FEATURES = {"qkv": HIDDEN, "o": H * D, "gate_up": HIDDEN, "down": WIDTH}


def operands(rng, tokens: int = T) -> dict[str, np.ndarray]:
    """Every operand of the layer but the offsets, by name (``tokens`` rows
    of h per sequence)."""
    out = {"h": rng.standard_normal((B, tokens, HIDDEN)).astype(np.float32),
           "input_norm": rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32)}
    for name, types in zip(("qkv", "o", "gate_up", "down"), PARTS):
        if name == "gate_up":
            out["post_norm"] = rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32)
        for i, (t, rows) in enumerate(zip(types, ROWS[name])):
            std = 1 / np.sqrt(FEATURES[name])
            out[f"{name}_w{i}"] = blocks_with_std(rng, t, rows, FEATURES[name], std)
    out["k_cache"] = rng.standard_normal((B, HKV, S, D)).astype(np.float32)
    out["v_cache"] = rng.standard_normal((B, HKV, S, D)).astype(np.float32)
    return out


def program(values: dict[str, np.ndarray], numerics: str, parts=PARTS) -> mp.Program:
    b = mp.ProgramBuilder("layer")
    named = [b.input(n, v.shape, str(v.dtype)) for n, v in values.items()]
    rest = [b.input("offset", (), "int32"), b.input("positions", (B,), "int32")]
    outs = b.transformer_layer(*named, *rest, heads=H, kv_heads=HKV,
                               ggml_parts=[list(p) for p in parts], numerics=numerics)
    return b.build(list(outs))


def run(values, numerics: str, native: bool, steps: int = 3) -> list[np.ndarray]:
    """The layer's h and caches after ``steps`` calls, each writing at the
    next slots (as many as h has rows per sequence)."""
    exe = mp.compile(program(values, numerics), native=native)
    state = dict(values)
    tokens = values["h"].shape[1]
    for step in range(steps):
        offset = np.array(step * tokens, np.int32)
        h, k, v = exe(*state.values(), offset, np.full((B,), step * tokens, np.int32))
        state.update(k_cache=np.array(k), v_cache=np.array(v))
    if native:
        assert exe.stats.native_ops.get("transformer_layer") == 1  # counted at the trace
    return [np.array(h), state["k_cache"], state["v_cache"]]


# Decode-sized steps (the parts' tiles in one pool job) and a prefill-sized
# one (18 rows: the exact panels as one GEMM over the parts, the int8 GEMM).
@pytest.mark.parametrize("tokens, steps", [(T, 3), (9, 1)])
@pytest.mark.parametrize("numerics", ["exact", "int8"])
def test_native_layer_equals_its_ops(numerics, tokens, steps):
    if mx.default_device() != mx.cpu:
        pytest.skip("the native layer runs on the CPU")
    values = operands(np.random.default_rng(5), tokens)
    want = run(values, "exact", native=False, steps=steps)
    got = run(values, numerics, native=True, steps=steps)
    tol = 1e-4 if numerics == "exact" else 5e-2
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * np.abs(w).max())


def test_parts_are_checked():
    values = operands(np.random.default_rng(6))
    arrays = list(values.values())
    rest = [np.array(0, np.int32), np.zeros((B,), np.int32)]
    attrs = dict(heads=H, kv_heads=HKV, ggml_parts=[list(p) for p in PARTS])
    assert_invalid("is not a GGML block type", "transformer_layer", *arrays, *rest,
                   **dict(attrs, ggml_parts=[["Q4_9"], ["Q4_K"], ["Q4_K"], ["Q4_K"]]))
    assert_invalid("qkv has 1 to 3 parts", "transformer_layer", *arrays, *rest,
                   **dict(attrs, ggml_parts=[["Q4_K"] * 4, ["Q4_K"], ["Q4_K"], ["Q4_K"]]))
    wrong = dict(values, o_w0=values["o_w0"][:, :100])
    assert_invalid("o_w0 must be uint8", "transformer_layer", *wrong.values(), *rest, **attrs)
    short = dict(values, qkv_w2=values["qkv_w2"][:64])
    assert_invalid("qkv's parts hold", "transformer_layer", *short.values(), *rest, **attrs)
    assert ggml_types.BY_NAME["IQ4_XS"].block == 256
