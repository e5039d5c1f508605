"""The recent ring: the last keys and values of a quantized KV cache in float (KIVI's
full-precision residual) on the native kernels: ``cache_attention`` with
``recent`` against a float64 reference written from the read rule on both
instruction-set paths; ``cache_attention_block`` and ``transformer_layer``
with a ring against the same reference, their updated rings against the
update rule, over a decode loop that feeds each step's outputs to the next;
the wrappers' coverage checks; and ``kv_cache_attention_block`` and
``transformer_layer`` with ``kv_recent`` on the native kernel against MLX's
ops.

The rule: query t at slot ``p = start + t`` reads a key and value j it sees
with ``p - j < R`` from the step's new rows when ``j >= start``, else from
ring entry ``j % R`` when ``recent_slots[b, j % R] == j``, else dequantized;
the step then writes into the ring its new tokens among the R slots up to
each row's last new token that the key mask keeps, those the mask keeps
(without a mask: its last ``min(T, R)`` tokens)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from mlxprog.native import Setting, kernels
from mlxprog.cache_kinds import AffineCache, FloatCache, hadamard_groups

from test_cache_attention_window_softcap import f64
from test_quantized_cache_attention import assert_same, cache_inputs, random_cache

QUANTIZATIONS = [(8, 32, False), (4, 64, False), (4, 32, True), (8, 64, True)]


def basis(x: np.ndarray, group_size: int, hadamard: bool) -> np.ndarray:
    """float32 rows ``[..., D]`` in the cache's basis (the ops' MLX transform,
    which the kernels match bit for bit)."""
    x = mx.array(x.astype(np.float32))
    return np.array(hadamard_groups(x, group_size) if hadamard else x)


def original(rows: np.ndarray, group_size: int, hadamard: bool) -> np.ndarray:
    """Rows in the cache's basis back in the original one, float64 (Sylvester's
    matrix per group: H H = group_size I)."""
    rows = rows.astype(np.float64)
    if not hadamard:
        return rows
    h = np.array([[1.0]])
    while h.shape[0] < group_size:
        h = np.block([[h, h], [h, -h]])
    grouped = rows.reshape(*rows.shape[:-1], -1, group_size) @ h / group_size
    return grouped.reshape(rows.shape)


def quantized(rows: np.ndarray, bits: int, group_size: int) -> list[mx.array]:
    """float32 rows (already in the cache's basis) as the cache holds them."""
    return list(mx.quantize(mx.array(rows), group_size=group_size, bits=bits))


def ring_tags(rng, B: int, R: int, start: int) -> np.ndarray:
    """recent_slots ``[B, R]`` of every kind: the entry's newest slot before
    start (read), that slot minus R (its entry, but out of the window),
    plus R (at or after start: a rolled-back speculative step's), another
    entry's slot, and -1."""
    tags = np.full((B, R), -1, np.int32)
    for b in range(B):
        for i in range(R):
            valid = start - 1 - (start - 1 - i) % R
            kinds = [valid, valid - R, valid + R, valid + 1, -1]
            tag = kinds[rng.choice(5, p=[0.5, 0.1, 0.15, 0.1, 0.15])]
            tags[b, i] = tag if tag >= 0 else -1
    return tags


def float_rows(held: np.ndarray, new: np.ndarray, ring: np.ndarray, tags: np.ndarray,
               start: int, p: int) -> np.ndarray:
    """The key (or value) rows ``[B, H_kv, S, D]`` the query at slot p reads:
    the cache's dequantized rows with the recent ring's in place."""
    rows, R = held.copy(), tags.shape[1]
    for j in range(max(0, p - R + 1), p + 1):
        if j >= start:
            rows[:, :, j] = new[:, :, j - start]
            continue
        for b in range(rows.shape[0]):
            if tags[b, j % R] == j:
                rows[b, :, j] = ring[b, :, j % R]
    return rows


def reference(q, k_held, v_held, new_k, new_v, k_ring, v_ring, tags, start, key_mask, scale,
              window, quant):
    """float64 attention of q ``[B, H, T, D]`` under the read rule; ``*_held``
    the cache's dequantized rows, all rows in the cache's basis."""
    _, group_size, hadamard = quant
    q = f64(q)
    B, H, T, D = q.shape
    group, keys = H // k_held.shape[1], np.arange(k_held.shape[2])
    mask = np.ones((B, keys.size), bool) if key_mask is None else np.array(key_mask)
    out = np.zeros_like(q)
    for t in range(T):
        p = start + t
        k, v = (np.repeat(original(float_rows(held, new, ring, tags, start, p), group_size,
                                   hadamard), group, axis=1)
                for held, new, ring in ((k_held, new_k, k_ring), (v_held, new_v, v_ring)))
        seen = (keys <= p) & ((keys > p - window) if window else True) & mask  # [B, S]
        scores = np.einsum("bhd,bhsd->bhs", q[:, :, t], k) * scale
        scores = np.where(seen[:, None], scores, -np.inf)
        top = np.where(seen.any(1)[:, None, None], scores.max(-1, keepdims=True), 0.0)
        weights = np.exp(scores - top)
        weights /= np.maximum(weights.sum(-1, keepdims=True), 1e-300)
        out[:, :, t] = np.einsum("bhs,bhsd->bhd", weights, v)
    return out


def updated_ring(k_ring, v_ring, tags, new_k, new_v, start, key_mask):
    """The ring after a step of T tokens at slot start (the update rule): in
    row b, entry i takes the newest slot s with s % R == i up to the row's
    last new token that key_mask keeps, when s >= start and the mask keeps s."""
    k_ring, v_ring, tags = k_ring.copy(), v_ring.copy(), tags.copy()
    B, R, T = tags.shape[0], tags.shape[1], new_k.shape[2]
    kept = np.ones((B, start + T), bool) if key_mask is None else np.array(key_mask)
    for b in range(B):
        new_kept = [t for t in range(T) if kept[b, start + t]]
        last = start + (new_kept[-1] if new_kept else -1)
        for i in range(R):
            slot = last - (last - i) % R
            if slot >= start and kept[b, slot]:
                k_ring[b, :, i], v_ring[b, :, i] = (new_k[b, :, slot - start],
                                                    new_v[b, :, slot - start])
                tags[b, i] = slot
    return k_ring, v_ring, tags


def random_ring(rng, B, H_kv, R, D, start, quant):
    _, group_size, hadamard = quant
    k_ring, v_ring = (basis(rng.standard_normal((B, H_kv, R, D)), group_size, hadamard)
                      for _ in "kv")
    return k_ring, v_ring, ring_tags(rng, B, R, start)


# -- the kernel ----------------------------------------------------------------------------

@pytest.mark.parametrize("quant", QUANTIZATIONS)
@pytest.mark.parametrize("R", [1, 4, 16])
def test_kernel_reads_the_recent_ring(ext, isa, R, quant):
    rng = np.random.default_rng(R)
    bits, group_size, hadamard = quant
    B, H, H_kv, S, D = 2, 6, 2, 90, 64  # S spans a block of 64 keys and a partial one
    k_all, v_all = (basis(rng.standard_normal((B, H_kv, S, D)), group_size, hadamard)
                    for _ in "kv")
    for T, start in ((1, 0), (1, 70), (3, 66), (20, 21), (20, 70)):
        # The cache holds the new rows quantized, as the op writes them first.
        new_k, new_v = k_all[:, :, start:start + T], v_all[:, :, start:start + T]
        parts = quantized(k_all, bits, group_size) + quantized(v_all, bits, group_size)
        k_held, v_held = (np.array(mx.dequantize(*c, group_size=group_size, bits=bits))
                          for c in (parts[:3], parts[3:]))
        k_ring, v_ring, tags = random_ring(rng, B, H_kv, R, D, start, quant)
        q = mx.array(rng.standard_normal((B, H, T, D)).astype(np.float32))
        recent = [mx.array(a) for a in (k_ring, v_ring, tags, new_k, new_v)]
        for window, key_mask in ((0, None), (6, mx.array(rng.random((B, S)) > 0.3))):
            got = ext.cache_attention(q, parts, mx.array([start], mx.int32), key_mask,
                                      scale=0.125, window=window,
                                      format=ext.CacheFormat(kv_bits=bits,
                                                             kv_group_size=group_size,
                                                             hadamard=hadamard),
                                      recent=recent)
            want = reference(q, k_held, v_held, new_k, new_v, k_ring, v_ring, tags, start,
                             key_mask, 0.125, window, quant)
            np.testing.assert_allclose(f64(got), want, rtol=1e-4, atol=5e-5,
                                       err_msg=f"T={T} start={start} window={window}")


def test_kernel_ring_changes_what_it_should(ext):
    """Only the ring's slots change: a ring of -1 tags and a step of T = 1
    reads the query's own key unrounded; without R the result is the plain
    quantized attention's."""
    rng = np.random.default_rng(5)
    B, H, S, D, bits, group_size = 1, 2, 40, 32, 4, 32
    k_all, v_all = (rng.standard_normal((B, 1, S, D)).astype(np.float32) for _ in "kv")
    parts = quantized(k_all, bits, group_size) + quantized(v_all, bits, group_size)
    q = mx.array(rng.standard_normal((B, H, 1, D)).astype(np.float32))
    start = mx.array([30], mx.int32)
    settings = dict(scale=0.2, format=ext.CacheFormat(kv_bits=bits, kv_group_size=group_size))
    plain = np.array(ext.cache_attention(q, parts, start, None, **settings))
    ring = [np.zeros((B, 1, 4, D), np.float32)] * 2 + [np.full((B, 4), -1, np.int32)]
    own = [mx.array(a) for a in ring + [k_all[:, :, 30:31], v_all[:, :, 30:31]]]
    got = np.array(ext.cache_attention(q, parts, start, None, **settings, recent=own))
    assert np.abs(got - plain).max() > 1e-3  # the own key's rounding matters at 4 bits
    k_held, v_held = (np.array(mx.dequantize(*c, group_size=group_size, bits=bits))
                      for c in (parts[:3], parts[3:]))
    want = reference(q, k_held, v_held, k_all[:, :, 30:31], v_all[:, :, 30:31], *ring, 30,
                     None, 0.2, 0, (bits, group_size, False))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=5e-5)


def test_kernel_refuses_a_malformed_ring(ext):
    q = mx.ones((1, 2, 1, 32))
    parts = quantized(np.ones((1, 1, 8, 32), np.float32), 8, 32) * 2
    rows, slots = mx.ones((1, 1, 4, 32)), mx.full((1, 4), -1, mx.int32)
    new = mx.ones((1, 1, 1, 32))
    call = dict(scale=1.0, format=ext.CacheFormat(kv_bits=8, kv_group_size=32))
    start = mx.array([3], mx.int32)
    with pytest.raises(ValueError, match="recent is k_recent, v_recent, recent_slots"):
        ext.cache_attention(q, parts, start, None, **call, recent=[rows, rows, slots])
    with pytest.raises(ValueError, match="k_recent and v_recent must be float32"):
        ext.cache_attention(q, parts, start, None, **call,
                            recent=[mx.ones((1, 1, 4, 16)), rows, slots, new, new])
    with pytest.raises(ValueError, match="recent_slots must be int32"):
        ext.cache_attention(q, parts, start, None, **call,
                            recent=[rows, rows, slots.astype(mx.int64), new, new])
    with pytest.raises(ValueError, match="new_k and new_v must be float32"):
        ext.cache_attention(q, parts, start, None, **call,
                            recent=[rows, rows, slots, mx.ones((1, 1, 2, 32)), new])
    with pytest.raises(ValueError, match="recent ring needs a quantized cache"):
        ext.cache_attention(q, [mx.ones((1, 1, 8, 32))] * 2, start, None, scale=1.0,
                            recent=[rows, rows, slots, new, new])


# -- the fused block and layer -------------------------------------------------------------

def block_reference(qkv, caches, k_ring, v_ring, tags, start, H, H_kv, quant, key_mask, scale):
    """The attention block's output ``[B, T, H D]`` and updated ring, from q
    and k rotated by MLX's RoPE (positions: the slots) and the cache's
    dequantized rows: the block writes its new rows first."""
    bits, group_size, hadamard = quant
    B, T, _ = qkv.shape
    D = caches[0].shape[3] * 32 // bits
    heads = qkv.reshape(B, T, H + 2 * H_kv, D).transpose(0, 2, 1, 3)
    q, k, v = mx.split(heads, [H, H + H_kv], axis=1)
    q, k = (mx.fast.rope(a, D, traditional=False, base=10000.0, scale=1.0, offset=start)
            for a in (q, k))
    new_k, new_v = (basis(np.array(a), group_size, hadamard) for a in (k, v))
    held = []
    for cache, new in ((caches[:3], new_k), (caches[3:], new_v)):
        rows = np.array(mx.dequantize(*cache, group_size=group_size, bits=bits))
        rows[:, :, start:start + T] = np.array(mx.dequantize(
            *quantized(new, bits, group_size), group_size=group_size, bits=bits))
        held.append(rows)
    out = reference(q, *held, new_k, new_v, k_ring, v_ring, tags, start, key_mask, scale, 0,
                    quant)
    return (out.transpose(0, 2, 1, 3).reshape(B, T, H * D),
            updated_ring(k_ring, v_ring, tags, new_k, new_v, start, key_mask))


def block_call(ext, qkv, state, start, H, H_kv, quant, key_mask, scale, with_ring=True):
    bits, group_size, hadamard = quant
    D = state[0].shape[3] * 32 // bits
    return ext.cache_attention_block(
        qkv, state[:6], mx.array([start], mx.int32), mx.array([start], mx.int32), heads=H,
        kv_heads=H_kv, dims=D, traditional=False, base=10000.0, rope_scale=1.0, scale=scale,
        key_mask=key_mask,
        format=ext.CacheFormat(kv_bits=bits, kv_group_size=group_size, hadamard=hadamard),
        recent=state[6:] if with_ring else None)


def assert_ring(got, want):
    for g, w, name in zip(got, want, ("k_recent", "v_recent", "recent_slots")):
        if name == "recent_slots":
            np.testing.assert_array_equal(np.array(g), w, err_msg=name)
        else:
            np.testing.assert_allclose(np.array(g), w, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("quant", QUANTIZATIONS)
@pytest.mark.parametrize("R", [1, 4, 16])
def test_block_decode_loop_reads_and_updates_the_ring(ext, R, quant):
    """Steps of T = 3, then 1 token at a time, then 20, each step's outputs
    the next step's operands (where the kernel may write into their
    buffers), with and without a key mask (row 1's last new tokens of the
    long step masked: right padding, never written into the ring); every
    step against the reference, and its caches against the block without a
    ring, bit for bit. A ring the caller still holds is never written
    into."""
    rng = np.random.default_rng(R + 1)
    bits, group_size, hadamard = quant
    B, H, H_kv, S, D = 2, 4, 2, 40, 64
    state = [mx.array(a) for a in quantized(rng.standard_normal((B, H_kv, S, D))
                                            .astype(np.float32), bits, group_size) * 2]
    state += [mx.array(a) for a in random_ring(rng, B, H_kv, R, D, 5, quant)]
    mx.eval(state)
    first, kept = list(state), [np.array(a) for a in state]
    mask = rng.random((B, S)) > 0.2
    mask[1, 26:31] = False  # the T = 20 step writes slots 11..30
    start = 5
    for T, masked in ((3, True), (1, True), (1, False), (1, True), (20, True), (1, False)):
        key_mask = mx.array(mask) if masked else None
        qkv = mx.array(rng.standard_normal((B, T, (H + 2 * H_kv) * D)).astype(np.float32))
        before = [np.array(a) for a in state]
        plain = block_call(ext, qkv, state, start, H, H_kv, quant, key_mask, 0.125, False)
        out, *state = block_call(ext, qkv, state, start, H, H_kv, quant, key_mask, 0.125)
        mx.eval(out, state, plain)
        assert len(state) == 9
        want_out, want_ring = block_reference(qkv, [mx.array(a) for a in before[:6]],
                                              *before[6:], start, H, H_kv, quant, key_mask,
                                              0.125)
        np.testing.assert_allclose(f64(out), want_out, rtol=1e-4, atol=5e-5, err_msg=f"T={T}")
        for got, cache in zip(state[:6], plain[1:]):
            np.testing.assert_array_equal(np.array(got), np.array(cache))
        assert_ring(state[6:], want_ring)
        start += T
    for array, original_data in zip(first, kept):
        np.testing.assert_array_equal(np.array(array), original_data)


def test_block_refuses_a_malformed_ring(ext):
    rng = np.random.default_rng(0)
    state = quantized(rng.standard_normal((1, 1, 8, 32)).astype(np.float32), 8, 32) * 2
    qkv = mx.ones((1, 1, 3 * 32))
    with pytest.raises(ValueError, match="cache_attention_block: the recent ring is three"):
        block_call(ext, qkv, state + [mx.ones((1, 1, 4, 32))] * 2, 0, 1, 1, (8, 32, False),
                   None, 1.0)
    with pytest.raises(ValueError, match="cache_attention_block: recent_slots must be int32"):
        block_call(ext, qkv, state + [mx.ones((1, 1, 4, 32))] * 2 + [mx.ones((1, 3), mx.int32)],
                   0, 1, 1, (8, 32, False), None, 1.0)


def layer_projections(rng, hidden, H, H_kv, D, inner, bits, group_size):
    sizes = {"qkv": ((H + 2 * H_kv) * D, hidden), "o": (hidden, H * D),
             "gate_up": (2 * inner, hidden), "down": (hidden, inner)}
    return {name: list(mx.quantize(mx.array(rng.standard_normal(size).astype(np.float32)
                                            * 0.1), group_size=group_size, bits=bits))
            for name, size in sizes.items()}


@pytest.mark.parametrize("quant", [(4, 32, True), (8, 64, False)])
@pytest.mark.parametrize("T", [1, 5])
def test_transformer_layer_with_a_ring_is_its_parts(ext, T, quant):
    """The layer's attention block reads and updates the ring as the block
    alone does (its projections and norms as the native kernels compute
    them, so the block's input is bit for bit the layer's)."""
    rng = np.random.default_rng(T)
    bits, group_size, hadamard = quant
    B, H, H_kv, D, S, R, hidden, inner, eps = 2, 4, 2, 64, 24, 4, 128, 192, 1e-5
    start = 9
    proj = layer_projections(rng, hidden, H, H_kv, D, inner, 4, 64)
    norms = [mx.array(rng.standard_normal(hidden).astype(np.float32)) for _ in "ab"]
    state = quantized(rng.standard_normal((B, H_kv, S, D)).astype(np.float32), bits,
                      group_size) * 2
    state += [mx.array(a) for a in random_ring(rng, B, H_kv, R, D, start, quant)]
    h = mx.array(rng.standard_normal((B, T, hidden)).astype(np.float32))
    offsets = mx.array([start], mx.int32)
    attrs = dict(heads=H, kv_heads=H_kv, dims=D, traditional=False, base=10000.0,
                 rope_scale=1.0, scale=0.125,
                 format=ext.CacheFormat(kv_bits=bits, kv_group_size=group_size,
                                        hadamard=hadamard))
    got = ext.transformer_layer(h, norms[0], proj["qkv"], proj["o"], norms[1], proj["gate_up"],
                                proj["down"], state[:6], offsets, offsets, eps=eps,
                                group_size=64, bits=4, recent=state[6:], **attrs)
    assert len(got) == 10
    qmm = dict(transpose=True, group_size=64, bits=4)
    qkv = ext.quantized_matmul(ext.rms_norm(h, norms[0], eps=eps), *proj["qkv"], **qmm)
    attn, *carried = ext.cache_attention_block(qkv, state[:6], offsets, offsets,
                                               recent=state[6:], **attrs)
    h1 = h + ext.quantized_matmul(attn, *proj["o"], **qmm)
    mlp = ext.swiglu_halves(ext.quantized_matmul(ext.rms_norm(h1, norms[1], eps=eps),
                                                 *proj["gate_up"], **qmm))
    want_h = h1 + ext.quantized_matmul(mlp, *proj["down"], **qmm)
    np.testing.assert_allclose(np.array(got[0]), np.array(want_h), rtol=1e-4, atol=1e-4)
    for g, w in zip(got[1:], carried):
        np.testing.assert_array_equal(np.array(g), np.array(w))


# -- the wrappers --------------------------------------------------------------------------

def test_wrappers_cover_only_a_fitting_ring(ext):
    B, H, H_kv, S, D, R, T = 1, 4, 2, 16, 32, 4, 2
    caches = quantized(np.ones((B, H_kv, S, D), np.float32), 8, 32) * 2
    ring = [mx.zeros((B, H_kv, R, D)), mx.zeros((B, H_kv, R, D)), mx.full((B, R), -1, mx.int32)]
    new = [mx.ones((B, H_kv, T, D))] * 2
    q = mx.ones((B, H, T, D))
    avals = [kernels.AVal.of(a) for a in ring]
    cache_avals = [kernels.AVal.of(c) for c in caches]
    eight = AffineCache(8, 32)
    assert kernels.covers_cache_attention(kernels.AVal.of(q), cache_avals, eight, avals)
    assert not kernels.covers_cache_attention(kernels.AVal.of(q), cache_avals, eight,
                                              avals[:2] + [kernels.AVal((B, R), mx.int64)])
    assert not kernels.covers_cache_attention(kernels.AVal.of(q), cache_avals, eight,
                                              [kernels.AVal((B, H_kv, 0, D), mx.float32)] * 2
                                              + [kernels.AVal((B, 0), mx.int32)])
    qkv = kernels.AVal((B, T, (H + 2 * H_kv) * D), mx.float32)
    assert kernels.covers_cache_attention_block(qkv, cache_avals, eight, avals)
    assert not kernels.covers_cache_attention_block(
        qkv, cache_avals, eight, [kernels.AVal((B, H_kv, R, D), mx.float16)] + avals[1:])
    float_caches = [kernels.AVal((B, H_kv, S, D), mx.float32)] * 2
    assert not kernels.covers_cache_attention_block(qkv, float_caches, FloatCache(), avals)

    setting = Setting(enabled=True)
    start = mx.array([3], mx.int32)
    got = kernels.cache_attention(setting, q, caches, start, None, 0.5, None, None, eight,
                                  recent=ring + new)
    assert got is not None and got.shape == (B, H, T, D)
    assert setting.counts == {"quantized_kv_cache_sdpa_update": 1}
    # New rows of another T, or of float16: MLX's ops instead.
    assert kernels.cache_attention(setting, q, caches, start, None, 0.5, None, None, eight,
                                   recent=ring + [mx.ones((B, H_kv, 1, D))] * 2) is None
    assert kernels.cache_attention(setting, q, caches, start, None, 0.5, None, None, eight,
                                   recent=ring + [n.astype(mx.float16) for n in new]) is None

    reason = kernels.transformer_layer_uncovered_reason(
        kernels.AVal((B, T, 64), mx.float32), kernels.AVal((64,), mx.float32),
        kernels.AVal((64,), mx.float32), {}, cache_avals, group_size=64, bits=4,
        numerics="float", kind=eight, recent=avals[:2])
    assert "recent ring" in reason
    assert not kernels.transformer_layer_uncovered_reason(
        kernels.AVal((B, T, 64), mx.float32), kernels.AVal((64,), mx.float32),
        kernels.AVal((64,), mx.float32), {}, cache_avals, group_size=64, bits=4,
        numerics="float", kind=eight, recent=avals)


# -- the op --------------------------------------------------------------------------------

@pytest.mark.parametrize("quant", [(4, 32, True), (8, 64, False)])
def test_block_op_with_kv_recent_matches_mlx_ops(ext, quant):
    """``kv_cache_attention_block`` with ``kv_recent``: a decode loop on the
    native kernel (one node) and on MLX's ops agree, ring included."""
    rng = np.random.default_rng(9)
    bits, group_size, hadamard = quant
    B, H, H_kv, D, S, R = 2, 4, 2, 64, 24, 4
    programs = {}
    for T in (3, 1):
        b = mp.ProgramBuilder("block")
        qkv = b.input("qkv", (B, T, (H + 2 * H_kv) * D), "float32")
        caches = cache_inputs(b, B, H_kv, S, D, bits, group_size)
        ring = [b.input("k_recent", (B, H_kv, R, D), "float32"),
                b.input("v_recent", (B, H_kv, R, D), "float32"),
                b.input("recent_slots", (B, R), "int32")]
        rest = [b.input("offset", (), "int32"), b.input("positions", (B,), "int32"),
                b.input("key_mask", (B, S), "bool")]
        outs = b.kv_cache_attention_block(qkv, *caches, *ring, *rest, heads=H, kv_heads=H_kv,
                                          kv_bits=bits, kv_group_size=group_size,
                                          kv_hadamard=hadamard, kv_recent=R)
        programs[T] = b.build(list(outs))
    start_state = random_cache(rng, B, H_kv, S, D, bits, group_size, hadamard)
    start_state += [mx.array(a) for a in random_ring(rng, B, H_kv, R, D, 6, quant)]
    state = {"native": start_state, "mlx": start_state}
    mask = mx.array(rng.random((B, S)) > 0.2)
    offset = 6
    for T in (3, 1, 1, 3, 1):
        qkv = mx.array(rng.standard_normal((B, T, (H + 2 * H_kv) * D)).astype(np.float32))
        outs = {}
        for name, native in (("native", True), ("mlx", False)):
            exe = mp.compile(programs[T], native=native)
            out, *carried = exe(qkv, *state[name], mx.array(offset, mx.int32),
                                mx.array([offset] * B, mx.int32), mask)
            state[name], outs[name] = carried, out
            if native:
                assert exe.stats.native_ops == {"kv_cache_attention_block": 1}
        assert_same([outs["native"], *state["native"]], [outs["mlx"], *state["mlx"]])
        offset += T


@pytest.mark.parametrize("quant", [(4, 32, True), (8, 64, False)])
@pytest.mark.parametrize("T", [1, 5])
def test_layer_op_with_kv_recent_matches_mlx_ops(ext, T, quant):
    """``transformer_layer`` with ``kv_recent``: the native kernel (one node)
    and MLX's ops agree, ring included, a masked last new token in row 1."""
    rng = np.random.default_rng(T)
    bits, group_size, hadamard = quant
    B, H, H_kv, D, S, R, hidden, inner, start = 2, 4, 2, 64, 24, 4, 128, 192, 9
    proj = layer_projections(rng, hidden, H, H_kv, D, inner, 4, 64)
    args = [mx.array(rng.standard_normal((B, T, hidden)).astype(np.float32)),
            mx.array(rng.uniform(0.5, 1.5, hidden).astype(np.float32))]
    for name in ("qkv", "o"):
        args += proj[name]
    args.append(mx.array(rng.uniform(0.5, 1.5, hidden).astype(np.float32)))
    for name in ("gate_up", "down"):
        args += proj[name]
    args += random_cache(rng, B, H_kv, S, D, bits, group_size, hadamard)
    args += [mx.array(a) for a in random_ring(rng, B, H_kv, R, D, start, quant)]
    mask = rng.random((B, S)) > 0.25
    mask[1, start + T - 1] = False
    args += [mx.array(start, mx.int32), mx.array([start] * B, mx.int32), mx.array(mask)]
    b = mp.ProgramBuilder("layer")
    inputs = [b.input(f"x{i}", a.shape, str(a.dtype).split(".")[-1]) for i, a in enumerate(args)]
    outs = b.transformer_layer(*inputs, heads=H, kv_heads=H_kv, group_size=64, bits=4,
                               kv_bits=bits, kv_group_size=group_size, kv_hadamard=hadamard,
                               kv_recent=R)
    prog = b.build(list(outs))
    native_exe, mlx_exe = mp.compile(prog, native=True), mp.compile(prog, native=False)
    got = native_exe(*args)
    assert len(got) == 10
    assert_same(got, mlx_exe(*args), atol=1e-4)
    assert native_exe.stats.native_ops == {"transformer_layer": 1}
