"""Attention and the fused KV-cache update (mlxprog/ops/attention.py) against
numpy references, run through compiled programs."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from helpers import assert_close, run_op
from kernel_helpers import RNG, TOL, as_np, check_invalid, randn

# Every op here runs with native CPU kernels and with MLX's ops (conftest.py).
pytestmark = pytest.mark.usefixtures("native_and_mlx_ops")


def ref_attention(q, k, v, scale, keep=None, additive=None, sinks=None, softcap=None):
    """softmax(q k^T * scale + mask) v over [B, H, T, D] numpy arrays, k/v heads
    repeated for grouped-query attention, scores capped at softcap * tanh(s /
    softcap) first if softcap is given; rows with no visible key are zero."""
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    scores = q @ k.swapaxes(-1, -2) * scale
    if softcap is not None:
        scores = softcap * np.tanh(scores / softcap)
    if additive is not None:
        scores = scores + additive
    if keep is not None:
        scores = np.where(keep, scores, -np.inf)
    if sinks is not None:
        column = np.broadcast_to(sinks[None, :, None, None], (*scores.shape[:-1], 1))
        scores = np.concatenate([scores, column], axis=-1)
    top = scores.max(-1, keepdims=True)
    weights = np.exp(scores - np.where(np.isfinite(top), top, 0))
    with np.errstate(invalid="ignore"):
        probs = np.nan_to_num(weights / weights.sum(-1, keepdims=True))
    if sinks is not None:
        probs = probs[..., :-1]
    return probs @ v


def qkv(b=2, hq=4, hkv=2, tq=3, tkv=5, d=8, dtype=mx.float32):
    return randn(b, hq, tq, d, dtype=dtype), randn(b, hkv, tkv, d, dtype=dtype), \
        randn(b, hkv, tkv, d, dtype=dtype)


CAUSAL = np.arange(5)[None, :] <= np.arange(3)[:, None] + 2  # T_q=3, T_kv=5, bottom-right


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("mask", ["none", "additive", "bool", "causal"])
def test_fast_sdpa_masks_and_sinks(mask, sinks):
    q, k, v = qkv()
    extra, keep, additive = [], None, None
    if mask == "additive":
        add = randn(1, 1, 3, 5)
        extra, additive = [add], as_np(add)
    elif mask == "bool":
        keep = RNG.random((2, 1, 3, 5)) < 0.7
        keep[..., 0] = True
        extra = [mx.array(keep)]
    elif mask == "causal":
        keep = CAUSAL
    sink = randn(4)
    got = run_op("fast_sdpa", q, k, v, *extra, *([sink] if sinks else []), scale=0.4,
                 mask="array" if mask in ("additive", "bool") else mask, sinks=sinks)
    expected = ref_attention(as_np(q), as_np(k), as_np(v), 0.4, keep, additive,
                             as_np(sink) if sinks else None)
    assert_close(got, expected, 1e-4, 1e-5, dtype=mx.float32)


@pytest.mark.parametrize("sinks", [False, True])
def test_fast_sdpa_causal_key_masked_left_padding(sinks):
    q, k, v = qkv()
    # Example 0 is left-padded by three keys, so its first query row sees none.
    key_mask = np.array([[False, False, False, True, True], [True] * 5])
    sink = randn(4)
    got = run_op("fast_sdpa", q, k, v, mx.array(key_mask), mx.array(1, mx.int32),
                 *([sink] if sinks else []), mask="causal_key_masked", sinks=sinks)
    keep = (np.arange(5)[None, :] <= np.arange(3)[:, None] + 1) & key_mask[:, None, None, :]
    expected = ref_attention(as_np(q), as_np(k), as_np(v), 8**-0.5, keep,
                             sinks=as_np(sink) if sinks else None)
    assert not keep[0, 0, 0].any()
    assert_close(got, expected, 1e-4, 1e-5)
    assert np.all(np.array(got)[0, :, 0] == 0)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_fast_sdpa_half_precision(dtype):
    q, k, v = qkv(dtype=dtype)
    mask, sinks = randn(3, 5), randn(4)  # float32 mask and sinks are cast to q's dtype
    got = run_op("fast_sdpa", q, k, v, mask, sinks, mask="array", sinks=True)
    expected = ref_attention(as_np(q), as_np(k), as_np(v), 8**-0.5, additive=as_np(mask),
                             sinks=as_np(sinks))
    assert_close(got, expected, *TOL[dtype], dtype=dtype)


def test_fast_sdpa_kv_offset_is_an_operand():
    b = mp.ProgramBuilder("sdpa")
    q, k, v = (b.input(n, s) for n, s in (("q", (1, 2, 1, 8)), ("k", (1, 2, 6, 8)),
                                          ("v", (1, 2, 6, 8))))
    key_mask = b.input("key_mask", (1, 6), "bool")
    offset = b.input("offset", (), "int32")
    exe = mp.compile(b.build(b.fast_sdpa(q, k, v, key_mask, offset, mask="causal_key_masked")))
    qa, ka, va = qkv(1, 2, 2, 1, 6)
    for pos in range(6):
        got = exe(qa, ka, va, mx.ones((1, 6), mx.bool_), mx.array(pos, mx.int32))[0]
        keep = np.arange(6)[None, :] <= pos
        assert_close(got, ref_attention(as_np(qa), as_np(ka), as_np(va), 8**-0.5, keep),
                     1e-4, 1e-5)
    assert exe.stats.traces == 1


@pytest.mark.parametrize(
    "shapes, attrs, match",
    [
        (((2, 4, 3), (2, 2, 5, 8), (2, 2, 5, 8)), {}, "q must be rank 4"),
        (((2, 3, 3, 8), (2, 2, 5, 8), (2, 2, 5, 8)), {},
         "q has 3 heads, which is not a multiple of the 2 key/value heads"),
        (((2, 4, 3, 8), (2, 2, 5, 4), (2, 2, 5, 4)), {}, "same head dim, found 8 and 4"),
        (((2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 4, 8)), {}, "same heads and tokens"),
        (((2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 8)), {"mask": "array"},
         r"takes operands \(q, k, v, mask\); found 3"),
        (((2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 8), (3,)), {"sinks": True}, r"sinks must be \[4\]"),
        (((2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 8), (2, 4), ()), {"mask": "causal_key_masked"},
         r"key_mask must be \[2, 5\]"),
    ],
)
def test_fast_sdpa_invalid(shapes, attrs, match):
    check_invalid(match, "fast_sdpa", *(mx.zeros(s) for s in shapes), **attrs)


def test_fast_sdpa_invalid_mask_attr():
    q, k, v = qkv()
    check_invalid("mask", "fast_sdpa", q, k, v, mask="sliding")


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("hidden", ["bool", "-inf", "lowest"])
@pytest.mark.parametrize("sinks", [False, True])
def test_fast_sdpa_array_mask_rows_that_see_no_key_are_zero(hidden, dtype, sinks, eager):
    # MLX gives such a row the average of all values (boolean mask), NaN (-inf)
    # or, for the dtype's lowest value, either one depending on the dtype.
    q, k, v = qkv(dtype=dtype)
    keep = np.ones((3, 5), bool)
    keep[1] = False
    if hidden == "bool":
        mask = mx.array(keep)
    else:
        low = -np.inf if hidden == "-inf" else np.finfo(np.float16 if dtype == mx.float16
                                                        else np.float32).min
        mask = mx.array(np.where(keep, 0, low).astype(np.float32))
    sink = [randn(4)] if sinks else []
    got = run_op("fast_sdpa", q, k, v, mask, *sink, mask="array", sinks=sinks, eager=eager)
    expected = ref_attention(as_np(q), as_np(k), as_np(v), 8 ** -0.5, keep,
                             sinks=as_np(sink[0]) if sinks else None)
    assert_close(got, expected, *TOL[dtype], dtype=dtype)
    assert not as_np(got)[:, :, 1].any()


@pytest.mark.parametrize("eager", [False, True])
def test_fast_sdpa_causal_queries_before_every_key_are_zero(eager):
    q, k, v = qkv(tq=4, tkv=2)
    keep = np.arange(2)[None, :] <= np.arange(4)[:, None] - 2  # rows 0 and 1 see no key
    got = run_op("fast_sdpa", q, k, v, mask="causal", eager=eager)
    assert_close(got, ref_attention(as_np(q), as_np(k), as_np(v), 8 ** -0.5, keep), 1e-4, 1e-5)


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("kv_offset, sees", [
    (np.int64(2**63 - 1), "all"),      # offset + i overflowed int64
    (np.int64(2**32 + 1), "all"),      # cast to int32 this would be 1
    (np.uint64(2**64 - 1), "all"),     # read as -1 through int64
    (np.int64(-2**63), "none"),
    (np.int8(-128), "none"),
])
def test_fast_sdpa_kv_offset_of_any_integer_dtype_and_value(kv_offset, sees, eager):
    q, k, v = qkv()
    key_mask = mx.ones((2, 5), mx.bool_)
    got = run_op("fast_sdpa", q, k, v, key_mask, kv_offset, mask="causal_key_masked",
                 eager=eager)
    keep = np.full((3, 5), sees == "all")
    assert_close(got, ref_attention(as_np(q), as_np(k), as_np(v), 8 ** -0.5, keep), 1e-4, 1e-5)


# -- fused KV-cache update ------------------------------------------------------


def ref_kv_update(q, nk, nv, kc, vc, offset, key_mask, layout, sinks=None, softcap=None,
                  window=None, scale=None):
    """Write the cache at the clamped offset, then attend with an explicit mask
    (with a window: only the last `window` slots up to the query's own)."""
    to_bhtd = (lambda a: as_np(a).swapaxes(1, 2)) if layout == "BTHD" else as_np
    q, nk, nv, kc, vc = map(to_bhtd, (q, nk, nv, kc, vc))
    t_max, t = kc.shape[2], nk.shape[2]
    start = min(max(offset, 0), t_max - t)
    kc[:, :, start : start + t], vc[:, :, start : start + t] = nk, nv
    slot, key = np.arange(t)[:, None] + start, np.arange(t_max)[None, :]
    keep = key <= slot
    if window is not None:
        keep = keep & (key > slot - window)
    if key_mask is not None:
        keep = keep & key_mask[:, None, None, :]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = ref_attention(q, kc, vc, scale, keep, sinks=sinks, softcap=softcap)
    if layout == "BTHD":
        out, kc, vc = (a.swapaxes(1, 2) for a in (out, kc, vc))
    return out, kc, vc


def kv_operands(layout, b=2, hq=4, hkv=2, t=1, t_max=6, d=8, dtype=mx.float32):
    def shaped(h, tokens):
        return (b, tokens, h, d) if layout == "BTHD" else (b, h, tokens, d)

    return (randn(*shaped(hq, t), dtype=dtype), randn(*shaped(hkv, t), dtype=dtype),
            randn(*shaped(hkv, t), dtype=dtype), randn(*shaped(hkv, t_max), dtype=dtype),
            randn(*shaped(hkv, t_max), dtype=dtype))


@pytest.mark.parametrize("layout", ["BTHD", "BHTD"])
@pytest.mark.parametrize("t, offset", [(1, 0), (1, 3), (1, 5), (1, 9), (2, 5), (3, -2)])
def test_kv_cache_sdpa_update(layout, t, offset):
    ops = kv_operands(layout, t=t)
    got = run_op("kv_cache_sdpa_update", *ops, mx.array(offset, mx.int32), layout=layout)
    for g, e in zip(got, ref_kv_update(*ops, offset, None, layout)):
        assert_close(g, e, 1e-4, 1e-5, dtype=mx.float32)


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("layout", ["BTHD", "BHTD"])  # BHTD: the native kernel
@pytest.mark.parametrize("offset, clamped", [
    (np.int64(2**32 + 1), 5),       # cast to int32 first this wrote at 1
    (np.uint64(2**63 + 2), 5),      # read as negative through int64
    (np.int64(-2**40), 0),
])
def test_kv_cache_sdpa_update_clamps_wide_offsets(layout, offset, clamped, eager):
    ops = kv_operands(layout)
    got = run_op("kv_cache_sdpa_update", *ops, offset, layout=layout, eager=eager)
    for g, e in zip(got, ref_kv_update(*ops, clamped, None, layout)):
        assert_close(g, e, 1e-4, 1e-5, dtype=mx.float32)


@pytest.mark.parametrize("layout, with_sinks", [("BTHD", False), ("BHTD", True)])
def test_kv_cache_sdpa_update_left_padded_prefill(layout, with_sinks):
    ops = kv_operands(layout, t=3)
    key_mask = np.array([[False, False, True, True, True, True], [True] * 6])
    sinks = randn(4)
    got = run_op("kv_cache_sdpa_update", *ops, mx.array([0], mx.int32), mx.array(key_mask),
                 *([sinks] if with_sinks else []), layout=layout, sinks=with_sinks)
    expected = ref_kv_update(*ops, 0, key_mask, layout, as_np(sinks) if with_sinks else None)
    for g, e in zip(got, expected):
        assert_close(g, e, 1e-4, 1e-5)
    # The first query of example 0 sees only padding: its output is zero.
    out = np.array(got[0])
    assert np.all((out[0, 0] if layout == "BTHD" else out[0, :, 0]) == 0)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_kv_cache_sdpa_update_half_precision(dtype):
    ops = kv_operands("BTHD", t=2, dtype=dtype)
    got = run_op("kv_cache_sdpa_update", *ops, mx.array(4, mx.int32))
    for g, e in zip(got, ref_kv_update(*ops, 4, None, "BTHD")):
        assert_close(g, e, *TOL[dtype], dtype=dtype)


def test_kv_cache_decode_loop_is_traced_once():
    t_max = 8
    b = mp.ProgramBuilder("decode")
    q = b.input("q", (1, 4, 1, 8))
    new_k, new_v = b.input("new_k", (1, 2, 1, 8)), b.input("new_v", (1, 2, 1, 8))
    k_cache, v_cache = b.input("k_cache", (1, 2, t_max, 8)), b.input("v_cache", (1, 2, t_max, 8))
    offset = b.input("offset", (), "int32")
    outs = b.kv_cache_sdpa_update(q, new_k, new_v, k_cache, v_cache, offset, layout="BHTD")
    exe = mp.compile(b.build(list(outs)))
    kc = vc = mx.zeros((1, 2, t_max, 8))
    ref_kc = ref_vc = kc
    for step in range(t_max):
        qa, nk, nv = randn(1, 4, 1, 8), randn(1, 2, 1, 8), randn(1, 2, 1, 8)
        out, kc, vc = exe(qa, nk, nv, kc, vc, mx.array(step, mx.int32))
        expected, ref_kc, ref_vc = ref_kv_update(qa, nk, nv, ref_kc, ref_vc, step, None, "BHTD")
        ref_kc, ref_vc = mx.array(ref_kc.astype(np.float32)), mx.array(ref_vc.astype(np.float32))
        assert_close(out, expected, 1e-4, 1e-5)
    assert_close(kc, np.array(ref_kc))
    assert exe.stats.traces == 1


@pytest.mark.parametrize("layout", ["BTHD", "BHTD"])
@pytest.mark.parametrize("window", [1, 2, 4, 50])
@pytest.mark.parametrize("t, offset", [(1, 0), (1, 5), (3, 2), (6, 0)])
def test_kv_cache_sdpa_update_sliding_window(layout, window, t, offset):
    ops = kv_operands(layout, t=t)
    got = run_op("kv_cache_sdpa_update", *ops, mx.array(offset, mx.int32), layout=layout,
                 window=window)
    for g, e in zip(got, ref_kv_update(*ops, offset, None, layout, window=window)):
        assert_close(g, e, 1e-4, 1e-5, dtype=mx.float32)


def test_sliding_window_is_mlx_lms_causal_mask():
    # mlx-lm's Gemma and Mistral models mask local layers with this.
    from mlx_lm.models import base
    ops = kv_operands("BHTD", t=3, t_max=7)
    got = run_op("kv_cache_sdpa_update", *ops, mx.array(4, mx.int32), layout="BHTD", window=3)
    keep = np.array(base.create_causal_mask(3, offset=4, window_size=3))
    cache = [as_np(c) for c in ops[3:]]
    for c, new in zip(cache, ops[1:3]):
        c[:, :, 4:7] = as_np(new)
    assert_close(got[0], ref_attention(as_np(ops[0]), *cache, 8 ** -0.5, keep), 1e-4, 1e-5)


@pytest.mark.parametrize("layout", ["BTHD", "BHTD"])
@pytest.mark.parametrize("softcap", [0.5, 3.0, 50.0])
@pytest.mark.parametrize("t, offset", [(1, 3), (3, 0), (2, 4)])
def test_kv_cache_sdpa_update_softcap(layout, softcap, t, offset):
    ops = kv_operands(layout, t=t)
    got = run_op("kv_cache_sdpa_update", *ops, mx.array(offset, mx.int32), layout=layout,
                 softcap=softcap, scale=0.9)
    for g, e in zip(got, ref_kv_update(*ops, offset, None, layout, softcap=softcap,
                                       scale=0.9)):
        assert_close(g, e, 1e-4, 1e-5, dtype=mx.float32)


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("layout, with_sinks", [("BTHD", False), ("BHTD", False),
                                                ("BHTD", True)])
@pytest.mark.parametrize("softcap, window", [(None, 2), (2.0, None), (2.0, 3)])
def test_kv_cache_sdpa_update_softcap_window_left_padded(layout, with_sinks, softcap, window,
                                                         eager):
    ops = kv_operands(layout, t=4)
    # Example 0's first query sees only padding; with window 2 its second sees
    # one key (its own), and every other query two.
    key_mask = np.array([[False, False, True, True, True, True], [True] * 6])
    sinks = randn(4)
    got = run_op("kv_cache_sdpa_update", *ops, mx.array(1, mx.int32), mx.array(key_mask),
                 *([sinks] if with_sinks else []), layout=layout, sinks=with_sinks,
                 softcap=softcap, window=window, eager=eager)
    expected = ref_kv_update(*ops, 1, key_mask, layout, as_np(sinks) if with_sinks else None,
                             softcap=softcap, window=window)
    for g, e in zip(got, expected):
        assert_close(g, e, 1e-4, 1e-5)
    out = np.array(got[0])
    assert np.all((out[0, 0] if layout == "BTHD" else out[0, :, 0]) == 0)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_kv_cache_sdpa_update_softcap_window_half_precision(dtype):
    ops = kv_operands("BTHD", t=2, dtype=dtype)
    got = run_op("kv_cache_sdpa_update", *ops, mx.array(4, mx.int32), softcap=1.5, window=3)
    for g, e in zip(got, ref_kv_update(*ops, 4, None, "BTHD", softcap=1.5, window=3)):
        assert_close(g, e, *TOL[dtype], dtype=dtype)


def test_kv_cache_decode_loop_with_window_and_softcap_is_traced_once():
    t_max, window = 8, 3
    b = mp.ProgramBuilder("decode")
    q = b.input("q", (1, 4, 1, 8))
    new_k, new_v = b.input("new_k", (1, 2, 1, 8)), b.input("new_v", (1, 2, 1, 8))
    k_cache, v_cache = b.input("k_cache", (1, 2, t_max, 8)), b.input("v_cache", (1, 2, t_max, 8))
    offset = b.input("offset", (), "int32")
    outs = b.kv_cache_sdpa_update(q, new_k, new_v, k_cache, v_cache, offset, layout="BHTD",
                                  window=window, softcap=5.0)
    exe = mp.compile(b.build(list(outs)))
    kc = vc = ref_kc = ref_vc = mx.zeros((1, 2, t_max, 8))
    for step in range(t_max):
        qa, nk, nv = randn(1, 4, 1, 8), randn(1, 2, 1, 8), randn(1, 2, 1, 8)
        out, kc, vc = exe(qa, nk, nv, kc, vc, mx.array(step, mx.int32))
        expected, ref_kc, ref_vc = ref_kv_update(qa, nk, nv, ref_kc, ref_vc, step, None, "BHTD",
                                                 softcap=5.0, window=window)
        ref_kc, ref_vc = mx.array(ref_kc.astype(np.float32)), mx.array(ref_vc.astype(np.float32))
        assert_close(out, expected, 1e-4, 1e-5)
    assert exe.stats.traces == 1


@pytest.mark.parametrize("attrs, match", [
    ({"softcap": 0.0}, "softcap"),
    ({"softcap": -1.0}, "softcap"),
    ({"softcap": float("inf")}, "softcap"),
    ({"window": 0}, "window"),
    ({"window": 2.0}, "window"),
])
def test_kv_cache_sdpa_update_invalid_softcap_and_window(attrs, match):
    ops = kv_operands("BTHD")
    check_invalid(match, "kv_cache_sdpa_update", *ops, mx.array(0, mx.int32), **attrs)


def test_kv_cache_sdpa_update_invalid():
    q, nk, nv, kc, vc = kv_operands("BTHD", t=2)
    off = mx.array(0, mx.int32)
    op = "kv_cache_sdpa_update"
    check_invalid("q has 1 tokens but new_k has 2", op, q[:, :1], nk, nv, kc, vc, off)
    check_invalid("7 new tokens do not fit a cache of 6", op, *kv_operands("BTHD", t=7), off)
    check_invalid(r"offset must be an integer array of shape \[\] or \[1\], found float32",
                  op, q, nk, nv, kc, vc, mx.array(0.0))
    check_invalid(r"key_mask must be \[2, 6\]", op, q, nk, nv, kc, vc, off, mx.ones((2, 5)))
    check_invalid("heads, which is not a multiple", op, q, nk, nv, kc, vc, off, layout="BHTD")
    check_invalid("same head dim, found 8 and 4", op, q, nk, nv, kc[..., :4], vc[..., :4], off)
    _, _, _, kc4, vc4 = kv_operands("BTHD", hkv=4)
    check_invalid("do not fit a cache", op, q, nk, nv, kc4, vc4, off)
