"""The fused ops that keep a decode step's graph small, each against the
same steps written with the separate ops, on the native kernel and on MLX's
ops, and their validation: ``kv_cache_attention_block`` (heads of a fused
q/k/v projection, Qwen3's per-head q/k norms, RoPE, cache writes,
attention), ``fast_add_rms_norm`` and the one-operand ``fast_swiglu``."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp


def block_program(B, T, H, Hkv, D, S, *, freqs=False, key_mask=True, positions_shape=None,
                  dtype="float32", qk_norm=False, **attrs):
    b = mp.ProgramBuilder("block")
    qkv = b.input("qkv", (B, T, (H + 2 * Hkv) * D), dtype)
    caches = [b.input(n, (B, Hkv, S, D), dtype) for n in ("k_cache", "v_cache")]
    offset = b.input("offset", (), "int32")
    positions = b.input("positions", (B,) if positions_shape is None else positions_shape,
                        "int32")
    extra = [b.input("freqs", (D // 2,), "float32")] if freqs else []
    extra += [b.input(n, (D,), "float32") for n in ("q_norm", "k_norm")] if qk_norm else []
    extra += [b.input("key_mask", (B, S), "bool")] if key_mask else []
    norms = {"qk_norm_eps": 1e-4} if qk_norm else {}
    outs = b.kv_cache_attention_block(qkv, *caches, offset, positions, *extra, heads=H,
                                      kv_heads=Hkv, freqs=freqs, **norms, **attrs)
    return b.build(list(outs))


def separate_program(B, T, H, Hkv, D, S, *, freqs=False, key_mask=True, positions_shape=None,
                     traditional=False, base=10000.0, rope_scale=1.0, scale=None,
                     qk_norm=False):
    """The same block from the ops a model would use without it (with
    ``qk_norm``, Qwen3's: each q and k head normed before RoPE)."""
    b = mp.ProgramBuilder("separate")
    qkv = b.input("qkv", (B, T, (H + 2 * Hkv) * D), "float32")
    caches = [b.input(n, (B, Hkv, S, D), "float32") for n in ("k_cache", "v_cache")]
    offset = b.input("offset", (), "int32")
    positions = b.input("positions", (B,) if positions_shape is None else positions_shape,
                        "int32")
    f = b.input("freqs", (D // 2,), "float32") if freqs else None
    norms = [b.input(n, (D,), "float32") for n in ("q_norm", "k_norm")] if qk_norm else []
    mask = [b.input("key_mask", (B, S), "bool")] if key_mask else []
    heads = b.transpose(b.reshape(qkv, shape=[B, T, H + 2 * Hkv, D]), axes=[0, 2, 1, 3])
    q, k, v = b.split(heads, indices_or_sections=[H, H + Hkv], axis=1)
    if norms:
        q, k = (b.fast_rms_norm(x, w, eps=1e-4) for x, w in zip((q, k), norms))

    def rope(x):
        if f is None:
            return b.fast_rope(x, positions, dims=D, traditional=traditional, base=base,
                               scale=rope_scale)
        return b.fast_rope_with_freqs(x, f, positions, dims=D, traditional=traditional,
                                      scale=rope_scale)

    out, kc, vc = b.kv_cache_sdpa_update(rope(q), rope(k), v, *caches, offset, *mask,
                                         layout="BHTD", scale=scale)
    out = b.reshape(b.transpose(out, axes=[0, 2, 1, 3]), shape=[B, T, H * D])
    return b.build([out, kc, vc])


def arguments(rng, B, T, H, Hkv, D, S, offset, positions, freqs=False, key_mask=True,
              qk_norm=False):
    args = [mx.array(rng.standard_normal((B, T, (H + 2 * Hkv) * D)).astype(np.float32)),
            mx.array(rng.standard_normal((B, Hkv, S, D)).astype(np.float32)),
            mx.array(rng.standard_normal((B, Hkv, S, D)).astype(np.float32)),
            mx.array(offset, mx.int32), mx.array(positions, mx.int32)]
    if freqs:
        args.append(mx.array((10000.0 ** (np.arange(D // 2) * 2 / D)).astype(np.float32)))
    if qk_norm:
        args += [mx.array(rng.uniform(0.5, 1.5, D).astype(np.float32)) for _ in range(2)]
    if key_mask:
        mask = rng.random((B, S)) > 0.25
        mask[:, 0] = True  # every query sees a key
        args.append(mx.array(mask))
    return args


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("case", [
    dict(B=1, T=1, H=9, Hkv=3, D=64, S=16, offset=5, positions=[5]),           # SmolLM2's decode
    dict(B=2, T=3, H=4, Hkv=2, D=16, S=8, offset=2, positions=[2, 0]),          # a prefill, GQA
    dict(B=2, T=2, H=2, Hkv=2, D=8, S=4, offset=9, positions=[3, 1]),           # offset clamped
    dict(B=1, T=4, H=3, Hkv=1, D=8, S=4, offset=0, positions=7, freqs=True,
         positions_shape=()),                                                   # scalar positions
    dict(B=3, T=1, H=2, Hkv=1, D=8, S=6, offset=1, positions=[4, 1, 2], key_mask=False,
         traditional=True, base=500.0, rope_scale=0.5, scale=0.3),
    dict(B=1, T=1, H=8, Hkv=4, D=64, S=16, offset=5, positions=[5], qk_norm=True),  # Qwen3
    dict(B=2, T=3, H=4, Hkv=2, D=16, S=8, offset=2, positions=[2, 0], qk_norm=True,
         freqs=True),                                                    # Qwen3's prefill
])
def test_block_equals_the_separate_ops(native, case):
    case = dict(case)
    offset, positions = case.pop("offset"), case.pop("positions")
    shape = {k: case.pop(k) for k in ("B", "T", "H", "Hkv", "D", "S")}
    options = {k: case[k] for k in ("freqs", "key_mask", "qk_norm") if k in case}
    rope = {k: case[k] for k in ("traditional", "base", "rope_scale", "scale") if k in case}
    args = arguments(np.random.default_rng(0), *shape.values(), offset, positions, **options)
    fused = mp.compile(block_program(*shape.values(), **options,
                                     positions_shape=case.get("positions_shape"), **rope),
                       native=native)
    separate = mp.compile(separate_program(*shape.values(), **options,
                                           positions_shape=case.get("positions_shape"), **rope),
                          native=False)
    got, want = fused(*args), separate(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.array(g), np.array(w), rtol=1e-5, atol=1e-5)
    assert fused.stats.native_ops == ({"kv_cache_attention_block": 1} if native else {})


def test_block_is_one_node_on_the_cpu():
    exe = mp.compile(block_program(1, 1, 9, 3, 64, 16), native=True)
    exe(*arguments(np.random.default_rng(1), 1, 1, 9, 3, 64, 16, 3, [3]))
    [segment] = exe.stats.segments
    assert segment.primitives.get("MlxprogCacheAttentionBlock") == 1
    assert segment.nodes <= 4  # the block and the offset's clamp


def test_block_updates_caches_in_a_decode_loop():
    """Steps that feed each output cache to the next step (as generation
    does, where MLX may donate the cache's buffer) match the separate ops."""
    rng = np.random.default_rng(2)
    fused = mp.compile(block_program(1, 1, 4, 2, 8, 6))
    separate = mp.compile(separate_program(1, 1, 4, 2, 8, 6), native=False)
    zeros = mx.zeros((1, 2, 6, 8))
    state = {"fused": (zeros, zeros), "separate": (zeros, zeros)}
    mask = mx.ones((1, 6), mx.bool_)
    for step in range(6):
        qkv = mx.array(rng.standard_normal((1, 1, 64)).astype(np.float32))
        results = {}
        for name, exe in (("fused", fused), ("separate", separate)):
            out, kc, vc = exe(qkv, *state[name], mx.array(step, mx.int32),
                              mx.array([step], mx.int32), mask)
            state[name] = (kc, vc)
            results[name] = out
        np.testing.assert_allclose(np.array(results["fused"]), np.array(results["separate"]),
                                   rtol=1e-5, atol=1e-5)
    for a, b in zip(state["fused"], state["separate"]):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("native", [True, False])
def test_block_never_writes_into_a_cache_the_caller_keeps(native):
    """The block takes over a cache's buffer only when nothing else holds
    the cache: caches the caller keeps (a prompt cache's prefix, say) are
    unchanged, and dropped ones are updated in place with the same result."""
    rng = np.random.default_rng(3)
    exe = mp.compile(block_program(1, 1, 4, 2, 8, 6, key_mask=False), native=native)
    kept_k, kept_v = (mx.array(rng.standard_normal((1, 2, 6, 8)).astype(np.float32))
                      for _ in range(2))
    mx.eval(kept_k, kept_v)
    before = np.array(kept_k), np.array(kept_v)
    qkv = mx.array(rng.standard_normal((1, 1, 64)).astype(np.float32))
    step = (qkv, mx.array(2, mx.int32), mx.array([2], mx.int32))
    out, k, v = exe(qkv, kept_k, kept_v, *step[1:])
    mx.eval(out, k, v)
    np.testing.assert_array_equal(np.array(kept_k), before[0])
    np.testing.assert_array_equal(np.array(kept_v), before[1])
    # Copies that only the call holds (the caller drops its references).
    out2, k2, v2 = exe(qkv, mx.array(before[0]), mx.array(before[1]), *step[1:])
    for a, b in ((out, out2), (k, k2), (v, v2)):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    assert not np.array_equal(np.array(k2), before[0])  # the new key was written


@pytest.mark.parametrize("change, message", [
    (dict(H=5), "heads 5 is not a multiple of kv_heads 2"),
    (dict(width=40), r"qkv must be \[1, T, 64\]"),
    (dict(cache_heads=3), "the caches hold 3 heads, attribute kv_heads is 2"),
    (dict(T=9), "9 new tokens do not fit a cache of 6"),
    (dict(dtype="float16"), "one float dtype"),
    (dict(positions_shape=(2,)), "positions must be an integer array"),
    (dict(rope_dims=3), "rope_dims must be even"),
    (dict(rope_dims=16), "rope_dims 16 exceeds the head dim 8"),
    (dict(q_norm=(4,)), r"q_norm must be a float \[8\] \(the caches' head dim\)"),
    (dict(k_norm_dtype="int32"), r"k_norm must be a float \[8\]"),
    (dict(norms=1), "with qk_norm_eps"),
])
def test_block_validation_names_the_problem(change, message):
    B, T, H, Hkv, D, S = 1, change.get("T", 1), change.get("H", 4), 2, 8, 6
    b = mp.ProgramBuilder("bad")
    qkv = b.input("qkv", (B, T, change.get("width", (H + 2 * Hkv) * D)),
                  change.get("dtype", "float32"))
    caches = [b.input(n, (B, change.get("cache_heads", Hkv), S, D), "float32")
              for n in ("k", "v")]
    offset = b.input("offset", (), "int32")
    positions = b.input("positions", change.get("positions_shape", (B,)), "int32")
    attrs = {"rope_dims": change["rope_dims"]} if "rope_dims" in change else {}
    norms = []
    if {"q_norm", "k_norm_dtype", "norms"} & set(change):
        attrs["qk_norm_eps"] = 1e-6
        norms = [b.input("q_norm", change.get("q_norm", (D,)), "float32"),
                 b.input("k_norm", (D,), change.get("k_norm_dtype", "float32"))]
        norms = norms[:change.get("norms", 2)]
    with pytest.raises(mp.ValidationError, match=message):
        b.kv_cache_attention_block(qkv, *caches, offset, positions, *norms, heads=H,
                                   kv_heads=Hkv, **attrs)


# -- fast_add_rms_norm ---------------------------------------------------------------------


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_add_rms_norm_is_the_add_then_the_norm(native, dtype):
    rng = np.random.default_rng(4)
    b = mp.ProgramBuilder("add_norm")
    x, y = (b.input(n, (2, 3, 40), dtype) for n in ("x", "y"))
    w = b.input("w", (40,), dtype)
    total, normed = b.fast_add_rms_norm(x, y, w, eps=1e-5)
    fused = mp.compile(b.build([total, normed]), native=native)
    args = [mx.array(rng.standard_normal(s).astype(np.float32)).astype(getattr(mx, dtype))
            for s in ((2, 3, 40), (2, 3, 40), (40,))]
    got_total, got_normed = fused(*args)
    want_total = args[0] + args[1]
    want_normed = mx.fast.rms_norm(want_total, args[2], 1e-5)
    np.testing.assert_array_equal(np.array(got_total), np.array(want_total))
    tol = 1e-6 if dtype == "float32" else 1e-2
    np.testing.assert_allclose(np.array(got_normed.astype(mx.float32)),
                               np.array(want_normed.astype(mx.float32)), rtol=tol, atol=tol)
    native_ops = fused.stats.native_ops
    if native and dtype == "float32":
        assert native_ops == {"fast_add_rms_norm": 1}
    else:  # float16 runs MLX's add and the plain (native) norm
        assert "fast_add_rms_norm" not in native_ops


@pytest.mark.parametrize("shapes, message", [
    (((2, 4), (2, 5), (4,)), "x and y must have one shape and dtype"),
    (((2, 4), (2, 4), (5,)), r"weight must be \[4\]"),
])
def test_add_rms_norm_validation(shapes, message):
    b = mp.ProgramBuilder("bad")
    x, y, w = (b.input(f"a{i}", s, "float32") for i, s in enumerate(shapes))
    with pytest.raises(mp.ValidationError, match=message):
        b.fast_add_rms_norm(x, y, w)


# -- fast_swiglu over halves ----------------------------------------------------------------


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("shape", [(1, 1, 2 * 37), (3, 5, 16), (2,)])
def test_swiglu_of_halves_is_the_two_operand_form(native, shape):
    rng = np.random.default_rng(5)
    b = mp.ProgramBuilder("swiglu")
    x = b.input("x", shape, "float32")
    gate, up = b.split(x, indices_or_sections=2, axis=-1)
    prog = b.build([b.fast_swiglu(x), b.fast_swiglu(gate, up)])
    exe = mp.compile(prog, native=native)
    values = (rng.standard_normal(shape) * 6).astype(np.float32)
    flat = values.reshape(-1)
    flat[: min(3, flat.size)] = [np.inf, -np.inf, np.nan][: min(3, flat.size)]
    halves, pair = exe(mx.array(values))
    assert halves.shape == (*shape[:-1], shape[-1] // 2)
    g, u = np.split(values.astype(np.float64), 2, axis=-1)
    with np.errstate(all="ignore"):
        want = g / (1 + np.exp(-g)) * u
    for got in (halves, pair):
        np.testing.assert_allclose(np.array(got), want, rtol=2e-6, atol=1e-6)
    # Both forms are one native node each.
    assert exe.stats.native_ops.get("fast_swiglu", 0) == (2 if native else 0)


def test_swiglu_of_two_operands_that_broadcast_runs_on_mlx():
    rng = np.random.default_rng(6)
    b = mp.ProgramBuilder("swiglu")
    gate, up = b.input("gate", (3, 8), "float32"), b.input("up", (1, 8), "float32")
    exe = mp.compile(b.build([b.fast_swiglu(gate, up)]), native=True)
    g, u = (rng.standard_normal(s).astype(np.float32) for s in ((3, 8), (1, 8)))
    [got] = exe(mx.array(g), mx.array(u))
    np.testing.assert_allclose(np.array(got), g / (1 + np.exp(-g.astype(np.float64))) * u,
                               rtol=2e-6, atol=1e-6)
    assert "fast_swiglu" not in exe.stats.native_ops


def test_swiglu_of_one_operand_needs_an_even_last_axis():
    b = mp.ProgramBuilder("bad")
    x = b.input("x", (2, 5), "float32")
    with pytest.raises(mp.ValidationError, match="even length"):
        b.fast_swiglu(x)
