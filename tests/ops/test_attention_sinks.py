"""Attention sinks (gpt-oss: one learned logit per query head that joins the
softmax's denominator and adds no value) on every attention op an LLM's
decoder can take with them: ``kv_cache_sdpa_update`` and
``quantized_kv_cache_sdpa_update`` (with its recent ring), on MLX's ops and on
the native kernels, with and without a sliding window, against a float64
reference written from the rule."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from mlxprog.cache_kinds import AffineCache

B, H, H_KV, S, D = 2, 4, 2, 12, 64


def reference(q, k_cache, v_cache, start, key_mask, sinks, window=None, scale=None):
    """Float64 attention one query at a time: query t (slot ``start + t``)
    over the keys it sees, the head's sink one more term of the softmax's
    denominator; a query that sees no key gives zeros."""
    q, k_cache, v_cache = (np.asarray(a, np.float64) for a in (q, k_cache, v_cache))
    scale = D ** -0.5 if scale is None else scale
    out = np.zeros(q.shape)
    for b, h, t in itertools.product(range(q.shape[0]), range(H), range(q.shape[2])):
        kv, p = h // (H // H_KV), start + t
        first = 0 if window is None else p - window + 1
        seen = [j for j in range(max(first, 0), p + 1) if key_mask[b, j]]
        if not seen:
            continue
        scores = k_cache[b, kv, seen] @ q[b, h, t] * scale
        top = max(scores.max(), sinks[h])
        weights = np.exp(scores - top)
        out[b, h, t] = weights @ v_cache[b, kv, seen] / (weights.sum() + np.exp(sinks[h] - top))
    return out


def case(rng, T, start):
    """q, new keys and values, the caches before the step, a key mask (left
    padding on row 1, a hole on row 0) and sinks, some large enough to take
    most of a query's attention."""
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    key_mask = np.ones((B, S), bool)
    key_mask[1, :2] = False
    key_mask[0, 3] = False
    sinks = np.array([-1.0, 0.5, 4.0, 2.0], np.float32)
    return (f32(B, H, T, D), f32(B, H_KV, T, D), f32(B, H_KV, T, D), f32(B, H_KV, S, D),
            f32(B, H_KV, S, D), key_mask, sinks)


def written(cache, new, start):
    """The cache with the step's new rows at ``start``."""
    cache = cache.copy()
    cache[:, :, start:start + new.shape[2]] = new
    return cache


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("T, start", [(1, 7), (4, 0), (3, 9)])
def test_float_cache_sinks(native, window, T, start):
    rng = np.random.default_rng(T + start)
    q, new_k, new_v, k_cache, v_cache, key_mask, sinks = case(rng, T, start)
    b = mp.ProgramBuilder("sinks")
    ins = [b.input(n, a.shape, "float32") for n, a in
           (("q", q), ("k", new_k), ("v", new_v), ("kc", k_cache), ("vc", v_cache))]
    rest = [b.input("offset", (), "int32"), b.input("key_mask", (B, S), "bool"),
            b.input("sinks", (H,), "bfloat16")]
    outs = b.kv_cache_sdpa_update(*ins, *rest, layout="BHTD", sinks=True, window=window)
    exe = mp.compile(b.build(list(outs)), native=native)
    sinks_bf16 = mx.array(sinks).astype(mx.bfloat16)
    out = exe(*[mx.array(a) for a in (q, new_k, new_v, k_cache, v_cache)],
              mx.array(start, mx.int32), mx.array(key_mask), sinks_bf16)[0]
    want = reference(q, written(k_cache, new_k, start), written(v_cache, new_v, start), start,
                     key_mask, np.array(sinks_bf16.astype(mx.float32)), window)
    np.testing.assert_allclose(np.array(out), want, rtol=1e-4, atol=2e-5)
    if native:
        assert exe.stats.native_ops == {"kv_cache_sdpa_update": 1}


def quantized_program(T, quant, recent, attrs) -> mp.Program:
    """One ``quantized_kv_cache_sdpa_update`` with sinks (and a recent ring
    of ``recent`` tokens, or none)."""
    bits, group_size, hadamard = quant
    b = mp.ProgramBuilder("quantized_sinks")
    ins = [b.input("q", (B, H, T, D), "float32")]
    ins += [b.input(n, (B, H_KV, T, D), "float32") for n in ("k", "v")]
    ins += [b.input(f"{side}_{part}", (B, H_KV, S, width), dtype)
            for side in "kv" for part, width, dtype in (
                ("values", D * bits // 32, "uint32"), ("scales", D // group_size, "float32"),
                ("biases", D // group_size, "float32"))]
    if recent:
        ins += [b.input("k_recent", (B, H_KV, recent, D), "float32"),
                b.input("v_recent", (B, H_KV, recent, D), "float32"),
                b.input("recent_slots", (B, recent), "int32")]
    ins += [b.input("offset", (), "int32"), b.input("key_mask", (B, S), "bool"),
            b.input("sinks", (H,), "float32")]
    outs = b.quantized_kv_cache_sdpa_update(
        *ins, bits=bits, group_size=group_size, hadamard=hadamard, sinks=True,
        **({"recent": recent} if recent else {}), **attrs)
    return b.build(list(outs))


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("quant", [(4, 32, True), (8, 64, False)])
@pytest.mark.parametrize("T, start", [(1, 7), (3, 9)])
def test_quantized_cache_sinks(native, window, quant, T, start):
    rng = np.random.default_rng(10 * T + start)
    q, new_k, new_v, k_cache, v_cache, key_mask, sinks = case(rng, T, start)
    kind = AffineCache(*quant)
    caches = kind.encode(mx.array(k_cache), "k") + kind.encode(mx.array(v_cache), "v")
    exe = mp.compile(quantized_program(T, quant, None, {"window": window}), native=native)
    out = exe(*[mx.array(a) for a in (q, new_k, new_v)], *caches, mx.array(start, mx.int32),
              mx.array(key_mask), mx.array(sinks))[0]
    # The reference reads the cache as the op holds it: every key and value
    # (the step's new ones too) through the quantization.
    held = [np.array(kind.decode(kind.encode(mx.array(written(c, n, start)), side), side))
            for side, c, n in (("k", k_cache, new_k), ("v", v_cache, new_v))]
    want = reference(q, *held, start, key_mask, sinks, window)
    np.testing.assert_allclose(np.array(out), want, rtol=1e-4, atol=2e-5)
    if native:
        assert exe.stats.native_ops == {"quantized_kv_cache_sdpa_update": 1}


@pytest.mark.parametrize("native", [False, True])
def test_quantized_cache_sinks_with_a_recent_ring(native):
    # A ring as long as the cache: every key the queries see is read in
    # float (the step's own, or the ring's), so the float reference holds.
    rng = np.random.default_rng(3)
    T, start, quant = 2, 6, (8, 64, False)
    q, new_k, new_v, k_cache, v_cache, key_mask, sinks = case(rng, T, start)
    kind = AffineCache(*quant)
    caches = kind.encode(mx.array(k_cache), "k") + kind.encode(mx.array(v_cache), "v")
    tags = np.array([[s if s < start else -1 for s in range(S)]] * B, np.int32)
    exe = mp.compile(quantized_program(T, quant, S, {"window": 4}), native=native)
    out = exe(*[mx.array(a) for a in (q, new_k, new_v)], *caches,
              *[mx.array(a) for a in (k_cache, v_cache, tags)], mx.array(start, mx.int32),
              mx.array(key_mask), mx.array(sinks))[0]
    want = reference(q, written(k_cache, new_k, start), written(v_cache, new_v, start), start,
                     key_mask, sinks, window=4)
    np.testing.assert_allclose(np.array(out), want, rtol=1e-4, atol=2e-5)
    if native:
        assert exe.stats.native_ops == {"quantized_kv_cache_sdpa_update": 1}


def test_sinks_operand_is_checked():
    b = mp.ProgramBuilder("bad")
    q = b.input("q", (1, 4, 1, 64), "float32")
    new = [b.input(n, (1, 2, 1, 64), "float32") for n in ("k", "v")]
    caches = [b.input(f"{side}_{part}", (1, 2, 8, width), dtype)
              for side in "kv" for part, width, dtype in (("values", 8, "uint32"),
                                                           ("scales", 2, "float32"),
                                                           ("biases", 2, "float32"))]
    offset = b.input("offset", (), "int32")
    with pytest.raises(mp.ValidationError, match=r"sinks must be \[4\]"):
        b.quantized_kv_cache_sdpa_update(q, *new, *caches, offset,
                                         b.input("sinks", (2,), "float32"), bits=4,
                                         group_size=32, sinks=True)
    with pytest.raises(mp.ValidationError, match="with sinks takes operands"):
        b.quantized_kv_cache_sdpa_update(q, *new, *caches, offset, bits=4, group_size=32,
                                         sinks=True)


@pytest.mark.parametrize("native", [False, True])
def test_non_finite_sinks(native):
    """A NaN or +inf sink makes its head's outputs NaN (as a softmax over
    it does), never a finite answer; a -inf sink takes no mass (no sink)."""
    rng = np.random.default_rng(4)
    q, new_k, new_v, k_cache, v_cache, key_mask, _ = case(rng, 1, 7)
    sinks = np.array([np.nan, np.inf, -np.inf, 0.5], np.float32)
    b = mp.ProgramBuilder("sinks")
    ins = [b.input(n, a.shape, "float32") for n, a in
           (("q", q), ("k", new_k), ("v", new_v), ("kc", k_cache), ("vc", v_cache))]
    rest = [b.input("offset", (), "int32"), b.input("key_mask", (B, S), "bool"),
            b.input("sinks", (H,), "float32")]
    outs = b.kv_cache_sdpa_update(*ins, *rest, layout="BHTD", sinks=True)
    exe = mp.compile(b.build(list(outs)), native=native)
    out = np.array(exe(*[mx.array(a) for a in (q, new_k, new_v, k_cache, v_cache)],
                       mx.array(7, mx.int32), mx.array(key_mask), mx.array(sinks))[0])
    assert np.isnan(out[:, :2]).all()
    kc, vc = written(k_cache, new_k, 7), written(v_cache, new_v, 7)
    want = reference(q, kc, vc, 7, key_mask, np.array([0, 0, -np.inf, 0.5]))
    np.testing.assert_allclose(out[:, 2:], want[:, 2:], rtol=1e-4, atol=2e-5)
