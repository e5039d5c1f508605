"""The quantized cache's recent ring (``quantized_kv_cache_sdpa_update``
with ``recent``): each query reads the last ``recent`` slots up to its own
unrounded (the step's new keys and values, or the ring's entries whose
slots still match) and every other key quantized; the step writes its last
``min(T, recent)`` tokens into the ring. Checked against a float64 loop
written from that rule, on MLX's ops and on the native kernels, and through
the two fused ops that take a ring too."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from mlxprog.cache_kinds import AffineCache

B, H, H_KV, S, D = 2, 4, 2, 24, 64


def _program(T: int, recent: int, bits: int, group_size: int, attrs: dict) -> mp.Program:
    b = mp.ProgramBuilder("recent")
    q = b.input("q", (B, H, T, D), "float32")
    new = [b.input(n, (B, H_KV, T, D), "float32") for n in ("k", "v")]
    packed, groups = D * bits // 32, D // group_size
    caches = [b.input(f"{kind}_{part}", (B, H_KV, S, width), dtype)
              for kind in "kv" for part, width, dtype in (("values", packed, "uint32"),
                                                           ("scales", groups, "float32"),
                                                           ("biases", groups, "float32"))]
    ring = [b.input("k_recent", (B, H_KV, recent, D), "float32"),
            b.input("v_recent", (B, H_KV, recent, D), "float32"),
            b.input("recent_slots", (B, recent), "int32")]
    rest = [b.input("offset", (), "int32"), b.input("key_mask", (B, S), "bool")]
    outs = b.quantized_kv_cache_sdpa_update(q, *new, *caches, *ring, *rest, bits=bits,
                                            group_size=group_size, recent=recent, **attrs)
    return b.build(list(outs))


def _reference(q, new_k, new_v, old_k, old_v, ring_k, ring_v, tags, start, key_mask, recent,
               quant, window=None, scale=None):
    """Float64 attention by the rule, one query at a time; ring rows are in
    the cache's basis (transformed back here), ``old_k``/``old_v`` the float
    caches before the step."""
    bits, group_size, hadamard = quant
    T = q.shape[2]
    k_cache = np.array(old_k, dtype=np.float64)
    v_cache = np.array(old_v, dtype=np.float64)
    k_cache[:, :, start:start + T], v_cache[:, :, start:start + T] = new_k, new_v
    kind = AffineCache(*quant)
    held = [np.array(kind.decode(kind.encode(mx.array(c.astype(np.float32)), side), side),
                     dtype=np.float64) for side, c in (("k", k_cache), ("v", v_cache))]
    to_float = (lambda x: np.array(kind.basis(mx.array(x)), dtype=np.float64) / group_size) \
        if hadamard else \
        (lambda x: np.array(x, dtype=np.float64))
    ring = [to_float(ring_k), to_float(ring_v)]
    scale = scale or D ** -0.5
    out = np.zeros(q.shape)
    for b, h, t in itertools.product(range(B), range(H), range(T)):
        kv, p = h // (H // H_KV), start + t
        first = 0 if window is None else p - window + 1
        seen = [j for j in range(max(first, 0), p + 1) if key_mask[b, j]]
        if not seen:
            continue
        keys, values = [], []
        for j in seen:
            if p - j < recent and j >= start:
                keys.append(new_k[b, kv, j - start]), values.append(new_v[b, kv, j - start])
            elif p - j < recent and tags[b, j % recent] == j:
                keys.append(ring[0][b, kv, j % recent]), values.append(ring[1][b, kv, j % recent])
            else:
                keys.append(held[0][b, kv, j]), values.append(held[1][b, kv, j])
        scores = np.array(keys, dtype=np.float64) @ np.array(q[b, h, t], np.float64) * scale
        weights = np.exp(scores - scores.max())
        out[b, h, t] = weights @ np.array(values, dtype=np.float64) / weights.sum()
    return out


def _case(rng, T, recent, start, quant):
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    q, new_k, new_v = f32(B, H, T, D), f32(B, H_KV, T, D), f32(B, H_KV, T, D)
    old_k, old_v = f32(B, H_KV, S, D), f32(B, H_KV, S, D)
    # The ring as earlier steps left it: the slots before start (their float
    # rows in the cache's basis), some overwritten by a rolled-back step's
    # later slots (stale: never read), some empty.
    tags = np.full((B, recent), -1, np.int32)
    ring_k, ring_v = f32(B, H_KV, recent, D), f32(B, H_KV, recent, D)
    for b in range(B):
        for s in range(max(start - recent, 0), start):
            tags[b, s % recent] = s
            for ring, cache in ((ring_k, old_k), (ring_v, old_v)):
                ring[b, :, s % recent] = np.array(AffineCache(*quant).basis(
                    mx.array(cache[b, :, s])))
    if start > 2:
        tags[0, (start - 2) % recent] = start - 2 + recent  # a rejected draft's slot
        tags[1, (start - 1) % recent] = -1
    key_mask = rng.random((B, S)) > 0.15
    key_mask[1, :3] = False
    key_mask[0, start + T - 1] = True
    key_mask[1, start + T - 1] = False  # right padding: not written into the ring
    return q, new_k, new_v, old_k, old_v, ring_k, ring_v, tags, key_mask


@pytest.mark.parametrize("quant", [(4, 32, True), (8, 64, False)])
@pytest.mark.parametrize("T, recent, start", [(1, 1, 9), (1, 4, 13), (1, 16, 23), (5, 4, 7),
                                              (3, 16, 17), (6, 2, 0), (8, 16, 16)])
@pytest.mark.parametrize("native", [False, True])
def test_ring_reads_recent_keys_unrounded_and_is_updated(quant, T, recent, start,
                                                                   native):
    rng = np.random.default_rng(T * 100 + recent + start)
    q, new_k, new_v, old_k, old_v, ring_k, ring_v, tags, key_mask = _case(
        rng, T, recent, start, quant)
    bits, group_size, hadamard = quant
    kind = AffineCache(*quant)
    caches = kind.encode(mx.array(old_k), "k") + kind.encode(mx.array(old_v), "v")
    prog = _program(T, recent, bits, group_size, {"hadamard": hadamard})
    args = [mx.array(a) for a in (q, new_k, new_v)] + caches
    args += [mx.array(a) for a in (ring_k, ring_v, tags)]
    args += [mx.array(start, mx.int32), mx.array(key_mask)]
    exe = mp.compile(prog, native=native)
    out, *rest = exe(*args)
    want = _reference(q, new_k, new_v, old_k, old_v, ring_k, ring_v, tags, start, key_mask,
                      recent, quant)
    np.testing.assert_allclose(np.array(out), want, rtol=1e-4, atol=2e-5)
    k_ring, v_ring, slots = (np.array(a) for a in rest[6:])
    # The ring: each row's last min(T, recent) tokens up to its last one
    # the key mask keeps (those it keeps) at slot % recent, the rest as it was.
    want_tags = tags.copy()
    want_k, want_v = ring_k.copy(), ring_v.copy()
    basis = lambda x: np.array(kind.basis(mx.array(x)))  # noqa: E731
    for b in range(B):
        kept = [start + t for t in range(T) if key_mask[b, start + t]]
        for s in [s for s in kept if s > max(kept) - recent]:
            want_tags[b, s % recent] = s
            want_k[b, :, s % recent] = basis(new_k[b, :, s - start])
            want_v[b, :, s % recent] = basis(new_v[b, :, s - start])
    np.testing.assert_array_equal(slots, want_tags)
    np.testing.assert_allclose(k_ring, want_k, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(v_ring, want_v, rtol=1e-6, atol=1e-6)
    if native:
        assert exe.stats.native_ops == {"quantized_kv_cache_sdpa_update": 1}


def test_a_ring_as_long_as_the_cache_is_float_attention():
    # Every slot in the ring's reach and in the ring: no key is read quantized.
    rng = np.random.default_rng(5)
    T, start, quant = 1, S - 1, (4, 32, True)
    recent = S
    q, new_k, new_v, old_k, old_v, ring_k, ring_v, tags, _ = _case(rng, T, recent, start, quant)
    tags = np.array([[s if s < start else -1 for s in range(S)]] * B, np.int32)
    kind = AffineCache(*quant)
    for s in range(start):
        ring_k[:, :, s] = np.array(kind.basis(mx.array(old_k[:, :, s])))
        ring_v[:, :, s] = np.array(kind.basis(mx.array(old_v[:, :, s])))
    caches = kind.encode(mx.array(old_k), "k") + kind.encode(mx.array(old_v), "v")
    prog = _program(T, recent, 4, 32, {"hadamard": True})
    out = mp.run(prog, *[mx.array(a) for a in (q, new_k, new_v)], *caches,
                 *[mx.array(a) for a in (ring_k, ring_v, tags)], mx.array(start, mx.int32),
                 mx.ones((B, S), mx.bool_))[0]
    k = np.concatenate([old_k[:, :, :start], new_k], axis=2).repeat(H // H_KV, axis=1)
    v = np.concatenate([old_v[:, :, :start], new_v], axis=2).repeat(H // H_KV, axis=1)
    scores = np.einsum("bhtd,bhsd->bhts", q, k) * D ** -0.5
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    want = np.einsum("bhts,bhsd->bhtd", weights / weights.sum(-1, keepdims=True), v)
    np.testing.assert_allclose(np.array(out), want, rtol=1e-4, atol=2e-5)


def test_ring_operands_are_checked_by_name():
    b = mp.ProgramBuilder("bad")
    q = b.input("q", (1, 2, 1, 64), "float32")
    new = [b.input(n, (1, 2, 1, 64), "float32") for n in ("k", "v")]
    caches = [b.input(f"{kind}_{part}", (1, 2, 8, width), dtype)
              for kind in "kv" for part, width, dtype in (("values", 8, "uint32"),
                                                           ("scales", 2, "float32"),
                                                           ("biases", 2, "float32"))]
    ring = [b.input("k_recent", (1, 2, 4, 64), "float32"),
            b.input("v_recent", (1, 2, 4, 64), "float32"),
            b.input("recent_slots", (1, 5), "int32")]
    offset = b.input("offset", (), "int32")
    with pytest.raises(mp.ValidationError, match=r"recent_slots must be int32\[1, 4\]"):
        b.quantized_kv_cache_sdpa_update(q, *new, *caches, *ring, offset, bits=4,
                                         group_size=32, recent=4)
    with pytest.raises(mp.ValidationError, match="with recent takes operands"):
        b.quantized_kv_cache_sdpa_update(q, *new, *caches, offset, bits=4, group_size=32,
                                         recent=4)
