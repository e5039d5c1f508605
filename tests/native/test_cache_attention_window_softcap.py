"""The native cache attention's sliding window and score softcap (Gemma's
local layers and attention logit softcapping): the kernel against a float64
reference on both instruction-set paths, and ``kv_cache_sdpa_update`` with
native kernels against the same program on MLX's ops."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp


def f64(a: mx.array) -> np.ndarray:
    return np.array(a).astype(np.float64)


def reference(q, k, v, start, key_mask, scale, window, softcap):
    """float64 attention: query t sees key j when start + t - window < j <=
    start + t and key_mask; scores capped at softcap * tanh(s / softcap)."""
    q, k, v = f64(q), f64(k), f64(v)
    B, H, T, D = q.shape
    group, keys = H // k.shape[1], np.arange(k.shape[2])
    out = np.zeros_like(q)
    for b in range(B):
        for h in range(H):
            kh, vh = k[b, h // group], v[b, h // group]
            for t in range(T):
                seen = keys <= start + t
                if window:
                    seen &= keys > start + t - window
                if key_mask is not None:
                    seen &= np.array(key_mask)[b]
                if not seen.any():
                    continue
                s = kh[seen] @ q[b, h, t] * scale
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                p = np.exp(s - s.max())
                out[b, h, t] = (p / p.sum()) @ vh[seen]
    return out


@pytest.mark.parametrize("softcap", [0.0, 0.7, 30.0])
@pytest.mark.parametrize("window", [0, 1, 4, 19, 40])
@pytest.mark.parametrize("heads", [(4, 4), (6, 2)])
def test_kernel_window_and_softcap_match_reference(ext, isa, heads, window, softcap):
    rng = np.random.default_rng(3)
    H, H_kv = heads
    B, S, D = 2, 19, 32
    k = mx.array(rng.standard_normal((B, H_kv, S, D)).astype(np.float32))
    v = mx.array(rng.standard_normal((B, H_kv, S, D)).astype(np.float32))
    for T in (1, 4):
        q = mx.array(rng.standard_normal((B, H, T, D)).astype(np.float32) * 2)
        for start in (0, 7, S - T):
            # The last mask hides keys 0..11: with a small window early queries see none.
            for key_mask in (None, mx.array(rng.random((B, S)) > 0.4),
                             mx.array(np.arange(S)[None, :].repeat(B, 0) >= 12)):
                got = ext.cache_attention(q, [k, v], mx.array([start], mx.int32), key_mask,
                                          scale=0.3, window=window, softcap=softcap)
                want = reference(q, k, v, start, key_mask, 0.3, window, softcap)
                np.testing.assert_allclose(f64(got), want, rtol=1e-4, atol=1e-5)


def test_kernel_rejects_negative_settings(ext):
    q = k = v = mx.ones((1, 1, 1, 8))
    for settings in ({"window": -1}, {"softcap": -1.0}, {"softcap": float("nan")}):
        with pytest.raises(ValueError, match="window and softcap must be >= 0"):
            ext.cache_attention(q, [k, v], mx.array([0], mx.int32), None, scale=1.0, **settings)


def test_kernel_softcap_of_non_finite_scores_matches_mlx(ext, isa):
    # A capped infinite score is finite (tanh(inf) = 1); a NaN stays NaN.
    q = mx.concatenate([mx.full((1, 1, 1, 8), float("nan")), mx.full((1, 1, 1, 8), float("inf"))],
                       axis=1)
    k, v = mx.ones((1, 1, 4, 8)), mx.arange(32, dtype=mx.float32).reshape(1, 1, 4, 8)
    got = np.array(ext.cache_attention(q, [k, v], mx.array([3], mx.int32), None, scale=1.0,
                                       softcap=2.0))
    assert np.isnan(got[0, 0]).all()
    np.testing.assert_allclose(got[0, 1], np.array(v).mean(axis=2)[0], rtol=1e-6)


def sdpa_program(B, H, H_kv, T, S, D, **attrs):
    b = mp.ProgramBuilder("attend")
    q = b.input("q", (B, H, T, D), "float32")
    new = [b.input(n, (B, H_kv, T, D), "float32") for n in ("k", "v")]
    caches = [b.input(n, (B, H_kv, S, D), "float32") for n in ("kc", "vc")]
    offset = b.input("offset", (), "int32")
    mask = b.input("mask", (B, S), "bool")
    outs = b.kv_cache_sdpa_update(q, *new, *caches, offset, mask, layout="BHTD", **attrs)
    return b.build(list(outs))


@pytest.mark.parametrize("attrs", [{"window": 3}, {"softcap": 1.5}, {"window": 5, "softcap": 50.0},
                                   {"window": 2**31 - 1, "scale": 0.2}])
def test_kv_cache_sdpa_update_runs_natively_and_matches_mlx_ops(ext, attrs):
    rng = np.random.default_rng(5)
    B, H, H_kv, S, D = 2, 6, 2, 16, 32
    for T, offset in ((1, 0), (1, 9), (1, 15), (4, 6), (16, 0)):
        prog = sdpa_program(B, H, H_kv, T, S, D, **attrs)
        args = [mx.array(rng.standard_normal(s).astype(np.float32)) for s in
                ((B, H, T, D), (B, H_kv, T, D), (B, H_kv, T, D), (B, H_kv, S, D),
                 (B, H_kv, S, D))]
        key_mask = rng.random((B, S)) > 0.2
        key_mask[0, :8] = False  # left padding: with a window some queries see no key
        args += [mx.array(offset, mx.int32), mx.array(key_mask)]
        native_exe, mlx_exe = mp.compile(prog, native=True), mp.compile(prog, native=False)
        for got, want in zip(native_exe(*args), mlx_exe(*args)):
            np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)
        assert native_exe.stats.native_ops == {"kv_cache_sdpa_update": 1}
