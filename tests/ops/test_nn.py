"""LLM kernels (mlxprog/ops/nn.py) against numpy references, run through
compiled programs."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pydantic
import pytest

import mlxprog as mp
from helpers import assert_close, run_op
from mlxprog.ops.nn import RopeAttrs

# Every op here runs with native CPU kernels and with MLX's ops (conftest.py).
pytestmark = pytest.mark.usefixtures("native_and_mlx_ops")

RNG = np.random.default_rng(0)


def randn(*shape, dtype=mx.float32) -> mx.array:
    return mx.array(RNG.standard_normal(shape).astype(np.float32)).astype(dtype)


def as_np(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32), dtype=np.float64)


def check_invalid(match: str, op: str, *operands, **attrs) -> None:
    with pytest.raises(mp.ValidationError, match=match) as info:
        run_op(op, *operands, **attrs)
    assert "instruction 0" in str(info.value) and op in str(info.value)


# Tolerances by dtype: (rtol, atol).
TOL = {mx.float32: (1e-5, 1e-5), mx.float16: (5e-3, 5e-3), mx.bfloat16: (3e-2, 3e-2)}


# -- norms and activations ------------------------------------------------------


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_fast_rms_norm(dtype):
    x, w = randn(3, 5, 16, dtype=dtype), randn(16, dtype=dtype)
    xn, wn = as_np(x), as_np(w)
    expected = xn / np.sqrt((xn**2).mean(-1, keepdims=True) + 1e-4) * wn
    assert_close(run_op("fast_rms_norm", x, w, eps=1e-4), expected, *TOL[dtype], dtype=dtype)


@pytest.mark.parametrize("with_bias", [False, True])
def test_fast_layer_norm(with_bias):
    x, w, b = randn(4, 16), randn(16), randn(16)
    xn = as_np(x)
    expected = (xn - xn.mean(-1, keepdims=True)) / np.sqrt(xn.var(-1, keepdims=True) + 1e-5)
    expected = expected * as_np(w) + (as_np(b) if with_bias else 0)
    got = run_op("fast_layer_norm", x, w, *([b] if with_bias else []))
    assert_close(got, expected, 1e-4, 1e-5, dtype=mx.float32)


def test_norm_weight_mismatch_is_a_validation_error():
    check_invalid("same size as the last dimension", "fast_rms_norm", randn(2, 8), randn(7))
    check_invalid("eps", "fast_layer_norm", randn(2, 8), randn(8), eps=-1.0)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_fast_swiglu(dtype):
    gate, up = randn(4, 8, dtype=dtype), randn(4, 8, dtype=dtype)
    g = as_np(gate)
    expected = g / (1 + np.exp(-g)) * as_np(up)
    assert_close(run_op("fast_swiglu", gate, up), expected, *TOL[dtype], dtype=dtype)


def test_gelu_approx():
    x = randn(64) * 3
    xn = as_np(x)
    expected = 0.5 * xn * (1 + np.tanh(np.sqrt(2 / np.pi) * (xn + 0.044715 * xn**3)))
    assert_close(run_op("gelu_approx", x), expected, 1e-5, 1e-6, dtype=mx.float32)


# -- attention ------------------------------------------------------------------


def ref_attention(q, k, v, scale, keep=None, additive=None, sinks=None):
    """softmax(q k^T * scale + mask) v over [B, H, T, D] numpy arrays, k/v heads
    repeated for grouped-query attention; rows with no visible key are zero."""
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    scores = q @ k.swapaxes(-1, -2) * scale
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


def ref_kv_update(q, nk, nv, kc, vc, offset, key_mask, layout, sinks=None):
    """Write the cache at the clamped offset, then attend with an explicit mask."""
    to_bhtd = (lambda a: as_np(a).swapaxes(1, 2)) if layout == "BTHD" else as_np
    q, nk, nv, kc, vc = map(to_bhtd, (q, nk, nv, kc, vc))
    t_max, t = kc.shape[2], nk.shape[2]
    start = min(max(offset, 0), t_max - t)
    kc[:, :, start : start + t], vc[:, :, start : start + t] = nk, nv
    keep = np.arange(t_max)[None, :] <= np.arange(t)[:, None] + start
    if key_mask is not None:
        keep = keep & key_mask[:, None, None, :]
    out = ref_attention(q, kc, vc, q.shape[-1] ** -0.5, keep, sinks=sinks)
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


# -- rotary position embeddings -------------------------------------------------


def ref_rope(x, angles, dims, traditional):
    """Rotate the first dims features of x by angles (broadcast to [..., dims/2])."""
    out, half = x.copy(), dims // 2
    cos, sin = np.cos(angles), np.sin(angles)
    if traditional:
        a, b = x[..., 0:dims:2], x[..., 1:dims:2]
        out[..., 0:dims:2], out[..., 1:dims:2] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = x[..., :half], x[..., half:dims]
        out[..., :half], out[..., half:dims] = a * cos - b * sin, a * sin + b * cos
    return out


B, H, T, D = 2, 3, 4, 16
ROPE = {"dims": 12, "base": 500.0, "scale": 0.5}  # partial rotation: 12 of 16 features
INV_FREQ = 500.0 ** (-np.arange(0, 12, 2) / 12) * 0.5  # scale folded in
LEFT_PADDED = np.array([[0, 0, 0, 1], [0, 1, 2, 3]])  # example 0 padded by two tokens


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("offset", ["attr", "scalar", "per_batch"])
def test_fast_rope_offsets(traditional, offset):
    x = randn(B, H, T, D)
    starts = {"attr": [5, 5], "scalar": [7, 7], "per_batch": [3, 11]}[offset]
    operand = {"attr": [], "scalar": [mx.array(7, mx.int32)],
               "per_batch": [mx.array(starts, mx.int32)]}[offset]
    attrs = {"offset": 5} if offset == "attr" else {}
    got = run_op("fast_rope", x, *operand, traditional=traditional, **ROPE, **attrs)
    positions = np.arange(T)[None, :] + np.array(starts)[:, None]
    angles = positions[:, None, :, None] * INV_FREQ
    assert_close(got, ref_rope(as_np(x), angles, 12, traditional), 1e-4, 1e-4, dtype=mx.float32)


@pytest.mark.parametrize("traditional", [False, True])
def test_fast_rope_with_freqs(traditional):
    x, freqs = randn(B, H, T, D), mx.array(RNG.uniform(1, 100, D // 2).astype(np.float32))
    got = run_op("fast_rope_with_freqs", x, freqs, mx.array([2, 9], mx.int32), dims=D,
                 traditional=traditional, scale=0.5)
    positions = np.arange(T)[None, :] + np.array([2, 9])[:, None]
    angles = positions[:, None, :, None] * 0.5 / as_np(freqs)
    assert_close(got, ref_rope(as_np(x), angles, D, traditional), 1e-4, 1e-4)


@pytest.mark.parametrize("traditional, heads", [(False, True), (True, True), (False, False)])
def test_fast_rope_positions(traditional, heads):
    x = randn(B, T, H, D) if heads else randn(B, T, D)
    got = run_op("fast_rope_positions", x, mx.array(LEFT_PADDED, mx.int32),
                 traditional=traditional, **ROPE)
    angles = LEFT_PADDED[..., None] * INV_FREQ
    if heads:
        angles = angles[:, :, None, :]
    assert_close(got, ref_rope(as_np(x), angles, 12, traditional), 1e-5, 1e-5, dtype=mx.float32)


@pytest.mark.parametrize("traditional", [False, True])
def test_fast_rope_with_freqs_positions(traditional):
    x, freqs = randn(B, T, H, D), mx.array(RNG.uniform(1, 100, 6).astype(np.float32))
    got = run_op("fast_rope_with_freqs_positions", x, mx.array(LEFT_PADDED * 3, mx.int32),
                 freqs, dims=12, traditional=traditional, scale=0.5)
    angles = (LEFT_PADDED * 3)[:, :, None, None] * 0.5 / as_np(freqs)
    assert_close(got, ref_rope(as_np(x), angles, 12, traditional), 1e-5, 1e-5)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_rope_half_precision(dtype):
    x = randn(B, T, H, D, dtype=dtype)
    got = run_op("fast_rope_positions", x, mx.array(LEFT_PADDED, mx.int32), **ROPE)
    angles = LEFT_PADDED[:, :, None, None] * INV_FREQ
    assert_close(got, ref_rope(as_np(x), angles, 12, False), *TOL[dtype], dtype=dtype)


INT32_MAX = 2**31 - 1


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("op", ["fast_rope", "fast_rope_positions"])
def test_rope_positions_outside_int32_clamp(op, eager):
    # Cast to int32, 2**32 + 1 became 1 and uint64 2**63 became 0.
    x = randn(B, T, H, D) if op == "fast_rope_positions" else randn(B, H, T, D)

    def rope(position):
        shape = (B, T) if op == "fast_rope_positions" else (B,)
        operand = np.full(shape, position, position.dtype)
        return as_np(run_op(op, x, operand, **ROPE, eager=eager))

    edge = rope(np.int32(INT32_MAX))
    np.testing.assert_array_equal(rope(np.int64(2**32 + 1)), edge)
    np.testing.assert_array_equal(rope(np.uint64(2**63)), edge)
    np.testing.assert_array_equal(rope(np.int64(-2**40)), rope(np.int32(-2**31)))
    assert not np.array_equal(edge, rope(np.int32(1)))


def test_rope_invalid():
    x, pos = randn(B, T, H, D), mx.array(LEFT_PADDED, mx.int32)
    check_invalid("dims must be even, found 5", "fast_rope", x, dims=5)
    check_invalid("dims 32 exceeds the head dim 16", "fast_rope_positions", x, pos, dims=32)
    check_invalid(r"positions must be \[2, 4\]", "fast_rope_positions", x, pos[:, :3], dims=8)
    check_invalid(r"freqs must be \[4\] \(dims / 2\)", "fast_rope_with_freqs", x,
                  mx.ones((8,)), dims=8)
    check_invalid("offset is given twice", "fast_rope", x, mx.array(1, mx.int32), dims=8,
                  offset=2)
    check_invalid("offset operand must be an integer array", "fast_rope", x, mx.array(1.0),
                  dims=8)
    check_invalid("rank >= 3", "fast_rope", x[0, 0], dims=8)
    check_invalid("rank >= 3", "fast_rope", mx.array(1.0), dims=2)
    check_invalid(r"x must be \[B, T, H, D\] or \[B, T, D\]", "fast_rope_positions",
                  mx.array(1.0), pos, dims=2)
    check_invalid("positions must be integer, found float32", "fast_rope_positions", x,
                  pos.astype(mx.float32), dims=8)
    check_invalid("dims", "fast_rope", x, dims=0)
    check_invalid("offset", "fast_rope", x, dims=8, offset=2**31)



def test_rope_attrs_check_dims_without_operands():
    # Even dims is an attribute-only rule, so the model checks it wherever it
    # validates (the schema and docs too), with no operands known.
    with pytest.raises(pydantic.ValidationError, match="dims must be even, found 5"):
        RopeAttrs.model_validate({"dims": 5})
    assert RopeAttrs.model_validate({"dims": 64}).dims == 64


# -- sampling -------------------------------------------------------------------

KEY = mx.random.key(7)
PROBS = np.array([0.5, 0.3, 0.15, 0.05])


def draws(n, probs=PROBS, key=KEY, **attrs):
    """n tokens drawn from one distribution in a single compiled call."""
    logits = mx.broadcast_to(mx.array(np.log(probs).astype(np.float32)), (n, len(probs)))
    ids, next_key = run_op("sample", logits, key, **attrs)
    assert ids.dtype == mx.int32 and ids.shape == (n,)
    return np.array(ids), next_key


def test_sample_greedy():
    logits = randn(5, 50)
    assert_close(run_op("sample_greedy", logits), np.argmax(as_np(logits), -1), dtype=mx.int32)
    ids, _ = run_op("sample", logits, KEY, temperature=0.0)
    assert_close(ids, np.argmax(as_np(logits), -1), dtype=mx.int32)


def test_sample_fixed_key_repeats_and_returns_the_next_key():
    logits = randn(64, 100)
    ids, next_key = run_op("sample", logits, KEY, top_p=0.75)
    again, _ = run_op("sample", logits, KEY, top_p=0.75)
    eager, _ = run_op("sample", logits, KEY, top_p=0.75, eager=True)
    other, _ = run_op("sample", logits, next_key, top_p=0.75)
    assert_close(again, np.array(ids))
    assert_close(eager, np.array(ids))
    assert not np.array_equal(np.array(other), np.array(ids))
    assert_close(next_key, np.array(mx.random.split(KEY)[1]))


def test_sample_top_k_stays_in_the_top_k():
    logits = randn(2000, 30)
    ids, _ = run_op("sample", logits, KEY, top_k=3)
    top3 = np.argsort(-as_np(logits), axis=-1)[:, :3]
    assert np.all((top3 == np.array(ids)[:, None]).any(-1))


@pytest.mark.parametrize("attrs, allowed", [
    ({"top_p": 0.75}, {0, 1}),
    ({"top_p": 0.85}, {0, 1, 2}),
    ({"min_p": 0.2}, {0, 1, 2}),
    ({"top_k": 3, "top_p": 0.75}, {0, 1}),
])
def test_sample_top_p_and_min_p_exclude_the_tail(attrs, allowed):
    ids, _ = draws(4000, **attrs)
    assert set(ids.tolist()) == allowed


def test_sample_distribution():
    n = 20000
    ids, _ = draws(n)
    freq = np.bincount(ids, minlength=4) / n
    assert np.all(np.abs(freq - PROBS) < 0.02), freq  # ~6 standard deviations
    ids, _ = draws(n, temperature=0.5)  # p ** 2, renormalised
    sharpened = PROBS**2 / (PROBS**2).sum()
    assert np.all(np.abs(np.bincount(ids, minlength=4) / n - sharpened) < 0.02)
    ids, _ = draws(n, top_p=0.75)  # renormalised over the nucleus {0, 1}
    assert abs(np.mean(ids == 0) - 0.5 / 0.8) < 0.02


@pytest.mark.parametrize("attrs, match", [
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"min_p": 1.0}, "min_p"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": 11}, "top_k 11 exceeds the vocabulary size 10"),
])
def test_sample_invalid_params(attrs, match):
    check_invalid(match, "sample", randn(2, 10), KEY, **attrs)


def test_sample_invalid_operands():
    check_invalid(r"key must be a PRNG key uint32\[2\]", "sample", randn(2, 10), mx.zeros((2,)))
    check_invalid("logits must be a float array", "sample", mx.zeros((2, 10), mx.int32), KEY)


def test_repetition_penalty():
    logits = randn(2, 12)
    history = np.array([[3, 3, 0, -1, -1], [11, 5, 7, 2, 12]])  # -1 and 12: unused slots
    got = run_op("repetition_penalty", logits, mx.array(history, mx.int32), penalty=1.5)
    expected = as_np(logits)
    for row, ids in enumerate(history):
        for i in set(ids.tolist()) & set(range(12)):
            value = expected[row, i]
            expected[row, i] = value / 1.5 if value > 0 else value * 1.5
    assert_close(got, expected, dtype=mx.float32)
    check_invalid("history must be integer token ids", "repetition_penalty", logits,
                  mx.zeros((3, 5), mx.int32), penalty=1.5)
    check_invalid("penalty", "repetition_penalty", logits, mx.zeros((2, 5), mx.int32), penalty=0)


def test_sampling_in_a_decode_step():
    """A key carried across compiled calls gives a reproducible token stream."""
    b = mp.ProgramBuilder("pick")
    logits = b.input("logits", (1, 20))
    key = b.input("key", (2,), "uint32")
    history = b.input("history", (1, 4), "int32")
    ids, next_key = b.sample(b.repetition_penalty(logits, history, penalty=2.0), key, top_k=5)
    exe = mp.compile(b.build([ids, next_key]))

    def stream():
        key, history, tokens = KEY, mx.full((1, 4), -1, mx.int32), []
        for step in range(4):
            ids, key = exe(mx.ones((1, 20)) * math.cos(step), key, history)
            history[0, step] = ids[0]
            tokens.append(ids.item())
        return tokens

    assert stream() == stream()
    assert exe.stats.traces == 1
