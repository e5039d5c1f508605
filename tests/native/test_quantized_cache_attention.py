"""Attention over a quantized KV cache (``kv_bits`` 4 or 8, with or without
the groups' Walsh-Hadamard transform) on the native kernels: the cache
quantization against ``mx.quantize`` and the transform against the ops'
MLX form, bit for bit; the attention kernel against a float64 reference
over the dequantized cache on both instruction-set paths; and the ops that
read such a cache (``quantized_kv_cache_sdpa_update``,
``kv_cache_attention_block`` and ``transformer_layer`` with ``kv_bits``)
against the same programs on MLX's ops."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from mlxprog.cache_kinds import AffineCache, hadamard_groups

from test_cache_attention_window_softcap import f64, reference

QUANTIZATIONS = [(8, 32), (8, 64), (4, 32), (4, 64), (4, 128), (8, 128)]


def quantized(x: mx.array, bits: int, group_size: int, hadamard: bool = False
              ) -> list[mx.array]:
    """x as a quantized cache holds it: [codes, scales, biases]."""
    return AffineCache(bits, group_size, hadamard).encode(x, "k")


def dequantized(parts: list[mx.array], bits: int, group_size: int,
                hadamard: bool = False) -> mx.array:
    return AffineCache(bits, group_size, hadamard).decode(parts, "k")


@pytest.mark.parametrize("group_size", [1, 2, 32, 64, 128])
def test_hadamard_is_the_ops_transform_bit_for_bit(ext, isa, group_size):
    rng = np.random.default_rng(group_size)
    x = mx.array((rng.standard_normal((7, 256)) * rng.choice([1e-3, 1, 1e4], (7, 1)))
                 .astype(np.float32))
    got = ext.hadamard(x, group_size)
    np.testing.assert_array_equal(np.array(got), np.array(hadamard_groups(x, group_size)))
    # Sylvester's matrix, one block per group: symmetric, H H = group_size I.
    h = np.array([[1.0]])
    while h.shape[0] < group_size:
        h = np.block([[h, h], [h, -h]])
    blocks = f64(x).reshape(7, -1, group_size) @ h
    np.testing.assert_allclose(f64(got), blocks.reshape(7, 256), rtol=1e-5, atol=1e-2)
    twice = f64(ext.hadamard(got, group_size)) / group_size
    np.testing.assert_allclose(twice, f64(x), rtol=1e-5, atol=1e-2)


@pytest.mark.parametrize("bits, group_size", QUANTIZATIONS)
def test_cache_quantization_is_mlx_quantize_bit_for_bit(ext, bits, group_size):
    rng = np.random.default_rng(bits + group_size)
    rows = rng.standard_normal((12, 256)).astype(np.float32)
    rows *= rng.choice([1e-6, 1e-2, 1.0, 300.0], size=(12, 1)).astype(np.float32)
    rows[0] = 0.0                     # all zero: scale eps, bias 0
    rows[1] = 2.5                     # constant: its extreme lands on a code
    rows[2, :128] = -rows[2, :128]    # signs mixed within the row
    rows[3] = np.abs(rows[3])         # every value positive
    rows[4] = -np.abs(rows[4])        # every value negative
    rows[5, ::7] = 1e-30              # near-zero denormal-scale values
    x = mx.array(rows)
    got = ext.quantize_rows(x, bits, group_size)
    want = quantized(x, bits, group_size)
    for name, g, w in zip(("codes", "scales", "biases"), got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        np.testing.assert_array_equal(np.array(g), np.array(w), err_msg=name)


@pytest.mark.parametrize("bits, group_size, hadamard", [(8, 32, False), (4, 64, False),
                                                       (4, 32, True), (8, 64, True)])
@pytest.mark.parametrize("softcap", [0.0, 5.0])
@pytest.mark.parametrize("window", [0, 3, 70])
@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (9, 3)])
def test_kernel_matches_float_attention_over_the_dequantized_cache(
        ext, isa, heads, window, softcap, bits, group_size, hadamard):
    rng = np.random.default_rng(7)
    H, H_kv = heads
    B, S, D = 2, 150, 64  # S spans blocks of 64 keys and a partial one
    k, v = (mx.array(rng.standard_normal((B, H_kv, S, D)).astype(np.float32)) for _ in "kv")
    quant = (bits, group_size, hadamard)
    parts = quantized(k, *quant) + quantized(v, *quant)
    k_held, v_held = dequantized(parts[:3], *quant), dequantized(parts[3:], *quant)
    for T in (1, 4):
        q = mx.array(rng.standard_normal((B, H, T, D)).astype(np.float32))
        for start in (0, 63, 64, S - T):
            for key_mask in (None, mx.array(rng.random((B, S)) > 0.3),
                             mx.array(np.arange(S)[None, :].repeat(B, 0) >= 100)):
                got = ext.cache_attention(q, parts, mx.array([start], mx.int32), key_mask,
                                          scale=0.125, window=window, softcap=softcap,
                                          format=ext.CacheFormat(kv_bits=bits,
                                                                 kv_group_size=group_size,
                                                                 hadamard=hadamard))
                want = reference(q, k_held, v_held, start, key_mask, 0.125, window, softcap)
                np.testing.assert_allclose(f64(got), want, rtol=1e-4, atol=5e-5)


def test_kernel_non_finite_scores_and_unseen_keys(ext, isa):
    # A NaN query gives NaN; a query whose keys are all masked gives zeros.
    q = mx.concatenate([mx.full((1, 1, 1, 32), float("nan")), mx.ones((1, 1, 1, 32))], axis=1)
    k = v = mx.ones((1, 1, 8, 32))
    parts = quantized(k, 8, 32) + quantized(v, 8, 32)
    eight = ext.CacheFormat(kv_bits=8, kv_group_size=32)
    got = np.array(ext.cache_attention(q, parts, mx.array([7], mx.int32), None, scale=1.0,
                                       format=eight))
    assert np.isnan(got[0, 0]).all()
    np.testing.assert_allclose(got[0, 1], 1.0, rtol=1e-6)
    hidden = mx.zeros((1, 8), dtype=mx.bool_)
    got = np.array(ext.cache_attention(q[:, 1:], parts, mx.array([7], mx.int32), hidden,
                                       scale=1.0, format=eight))
    np.testing.assert_array_equal(got, 0.0)


def test_kernel_refuses_a_malformed_cache(ext):
    q = mx.ones((1, 2, 1, 32))
    parts = quantized(mx.ones((1, 1, 4, 32)), 8, 32) * 2
    eight = ext.CacheFormat(kv_bits=8, kv_group_size=32)
    with pytest.raises(ValueError, match="kv_bits must be 0"):
        ext.CacheFormat(kv_bits=3, kv_group_size=32)
    with pytest.raises(ValueError, match="kv_group_size must be 32, 64 or 128"):
        ext.CacheFormat(kv_bits=8, kv_group_size=16)
    with pytest.raises(ValueError, match="a quantized cache is six arrays"):
        ext.cache_attention(q, parts[:4], mx.array([0], mx.int32), None, scale=1.0,
                            format=eight)
    with pytest.raises(ValueError, match="codes: uint32"):
        ext.cache_attention(q, [parts[1]] + parts[1:], mx.array([0], mx.int32), None,
                            scale=1.0, format=eight)
    with pytest.raises(ValueError, match="a float cache is two arrays"):
        ext.cache_attention(q, parts, mx.array([0], mx.int32), None, scale=1.0)
    with pytest.raises(ValueError, match="hadamard is a quantized cache's setting"):
        ext.CacheFormat(hadamard=True)


# -- the ops -------------------------------------------------------------------------------

def cache_inputs(b: mp.ProgramBuilder, B: int, H_kv: int, S: int, D: int, bits: int,
                 group_size: int) -> list:
    """The six quantized cache inputs of a program."""
    packed, groups = D * bits // 32, D // group_size
    return [b.input(f"{kind}_{part}", (B, H_kv, S, width), dtype)
            for kind in "kv" for part, width, dtype in (("values", packed, "uint32"),
                                                       ("scales", groups, "float32"),
                                                       ("biases", groups, "float32"))]


def random_cache(rng, B, H_kv, S, D, bits, group_size, hadamard=False) -> list[mx.array]:
    return [part for _ in "kv" for part in quantized(
        mx.array(rng.standard_normal((B, H_kv, S, D)).astype(np.float32)), bits, group_size,
        hadamard)]


def assert_same(got, want, atol=2e-5):
    for i, (g, w) in enumerate(zip(got, want)):
        if g.dtype == mx.uint32:  # codes: equal, bit for bit
            np.testing.assert_array_equal(np.array(g), np.array(w), err_msg=f"result {i}")
        else:
            np.testing.assert_allclose(np.array(g), np.array(w), rtol=1e-4, atol=atol,
                                       err_msg=f"result {i}")


@pytest.mark.parametrize("bits, group_size", [(8, 64), (4, 32)])
@pytest.mark.parametrize("attrs", [{}, {"window": 4}, {"softcap": 3.0, "scale": 0.2},
                                   {"hadamard": True}, {"hadamard": True, "window": 7}])
def test_quantized_sdpa_runs_natively_and_matches_mlx_ops(ext, bits, group_size, attrs):
    rng = np.random.default_rng(11)
    B, H, H_kv, S, D = 2, 6, 2, 80, 64
    for T, offset in ((1, 0), (1, 79), (3, 40), (5, 200)):
        b = mp.ProgramBuilder("quantized")
        q = b.input("q", (B, H, T, D), "float32")
        new = [b.input(n, (B, H_kv, T, D), "float32") for n in ("k", "v")]
        caches = cache_inputs(b, B, H_kv, S, D, bits, group_size)
        offset_in, mask = b.input("offset", (), "int32"), b.input("mask", (B, S), "bool")
        outs = b.quantized_kv_cache_sdpa_update(q, *new, *caches, offset_in, mask, bits=bits,
                                                group_size=group_size, **attrs)
        prog = b.build(list(outs))
        key_mask = rng.random((B, S)) > 0.2
        key_mask[0, :30] = False  # left padding
        args = [mx.array(rng.standard_normal(s).astype(np.float32))
                for s in ((B, H, T, D), (B, H_kv, T, D), (B, H_kv, T, D))]
        args += random_cache(rng, B, H_kv, S, D, bits, group_size, attrs.get("hadamard", False))
        args += [mx.array(offset, mx.int32), mx.array(key_mask)]
        native_exe, mlx_exe = mp.compile(prog, native=True), mp.compile(prog, native=False)
        assert_same(native_exe(*args), mlx_exe(*args))
        assert native_exe.stats.native_ops == {"quantized_kv_cache_sdpa_update": 1}


def block_program(B, T, H, H_kv, D, S, bits, group_size, hadamard, key_mask=True):
    b = mp.ProgramBuilder("block")
    qkv = b.input("qkv", (B, T, (H + 2 * H_kv) * D), "float32")
    caches = cache_inputs(b, B, H_kv, S, D, bits, group_size)
    rest = [b.input("offset", (), "int32"), b.input("positions", (B,), "int32")]
    rest += [b.input("key_mask", (B, S), "bool")] if key_mask else []
    outs = b.kv_cache_attention_block(qkv, *caches, *rest, heads=H, kv_heads=H_kv,
                                      kv_bits=bits, kv_group_size=group_size,
                                      kv_hadamard=hadamard)
    return b.build(list(outs))


def block_arguments(rng, B, T, H, H_kv, D, S, bits, group_size, hadamard, offset, positions):
    mask = rng.random((B, S)) > 0.25
    mask[:, 0] = True
    return [mx.array(rng.standard_normal((B, T, (H + 2 * H_kv) * D)).astype(np.float32)),
            *random_cache(rng, B, H_kv, S, D, bits, group_size, hadamard),
            mx.array(offset, mx.int32),
            mx.array(positions, mx.int32), mx.array(mask)]


@pytest.mark.parametrize("case", [
    dict(B=1, T=1, H=9, H_kv=3, D=64, S=80, bits=8, group_size=64, hadamard=True, offset=70,
         positions=[70]),
    dict(B=2, T=4, H=4, H_kv=2, D=32, S=16, bits=4, group_size=32, hadamard=True, offset=3,
         positions=[3, 0]),
    dict(B=1, T=2, H=2, H_kv=1, D=128, S=8, bits=4, group_size=128, hadamard=False, offset=20,
         positions=[5]),
])
def test_quantized_block_equals_mlx_ops(ext, case):
    case = dict(case)
    offset, positions = case.pop("offset"), case.pop("positions")
    args = block_arguments(np.random.default_rng(2), *case.values(), offset, positions)
    prog = block_program(*case.values())
    native_exe, mlx_exe = mp.compile(prog, native=True), mp.compile(prog, native=False)
    got = native_exe(*args)
    assert len(got) == 7
    assert_same(got, mlx_exe(*args))
    assert native_exe.stats.native_ops == {"kv_cache_attention_block": 1}
    [segment] = native_exe.stats.segments
    assert segment.primitives.get("MlxprogCacheAttentionBlock") == 1


def test_quantized_block_decode_loop_donates_and_keeps_what_the_caller_keeps(ext):
    """Steps that feed each output cache to the next (where the kernel may
    write into the cache's buffers) match MLX's ops; a cache the caller
    still holds is never written into."""
    rng = np.random.default_rng(4)
    B, T, H, H_kv, D, S, bits, gs = 1, 1, 4, 2, 32, 6, 8, 32
    prog = block_program(B, T, H, H_kv, D, S, bits, gs, True, key_mask=False)
    native_exe, mlx_exe = mp.compile(prog, native=True), mp.compile(prog, native=False)
    start = random_cache(rng, B, H_kv, S, D, bits, gs, True)
    mx.eval(start)
    kept = [np.array(a) for a in start]
    state = {"native": start, "mlx": start}
    for step in range(S):
        qkv = mx.array(rng.standard_normal((B, T, (H + 2 * H_kv) * D)).astype(np.float32))
        outs = {}
        for name, exe in (("native", native_exe), ("mlx", mlx_exe)):
            out, *caches = exe(qkv, *state[name], mx.array(step, mx.int32),
                               mx.array([step], mx.int32))
            state[name], outs[name] = caches, out
        assert_same([outs["native"], *state["native"]], [outs["mlx"], *state["mlx"]])
    for array, before in zip(start, kept):
        np.testing.assert_array_equal(np.array(array), before)


@pytest.mark.parametrize("change, message", [
    (dict(scales_dtype="float16"), r"k_scales must be float32\[1, 2, 6, 1\]"),
    (dict(packed=4), "k_values holds 16 features a head, which do not split into groups of 32"),
    (dict(qkv_dtype="float16"), "qkv must be float32 with a quantized cache"),
    (dict(cache_heads=3), "the caches hold 3 heads, attribute kv_heads is 2"),
    (dict(drop=1), r"kv_cache_attention_block with kv_bits takes operands \(qkv, k_values"),
    (dict(kv_bits=None), "kv_hadamard is a setting of the quantized cache"),
])
def test_quantized_block_validation_names_the_problem(change, message):
    B, H, H_kv, D, S = 1, 4, 2, 32, 6
    b = mp.ProgramBuilder("bad")
    qkv = b.input("qkv", (B, 1, (H + 2 * H_kv) * D), change.get("qkv_dtype", "float32"))
    heads = change.get("cache_heads", H_kv)
    caches = []
    for kind in "kv":
        caches.append(b.input(f"{kind}_values", (B, heads, S, change.get("packed", 8)), "uint32"))
        for part in ("scales", "biases"):
            caches.append(b.input(f"{kind}_{part}", (B, heads, S, 1),
                                  change.get(f"{part}_dtype", "float32")))
    caches = caches[:len(caches) - change.get("drop", 0)]
    rest = [b.input("offset", (), "int32"), b.input("positions", (B,), "int32")]
    with pytest.raises(mp.ValidationError, match=message):
        b.kv_cache_attention_block(qkv, *caches, *rest, heads=H, kv_heads=H_kv,
                                   kv_bits=change.get("kv_bits", 8), kv_group_size=32,
                                   kv_hadamard=True)
