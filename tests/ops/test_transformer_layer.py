"""``transformer_layer``: a llama-style decoder layer as one op, against the
ops it is defined by (``fast_rms_norm``, ``quantized_matmul``,
``kv_cache_attention_block``, ``fast_add_rms_norm``, ``fast_swiglu``) on
the native kernel (one graph node) and on MLX's ops; its cache updates in a
decode loop, also when the next step is dispatched before the last one ran;
and its validation."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from mlxprog.cache_kinds import AffineCache

PROJECTIONS = ("qkv", "o", "gate_up", "down")


def shapes(B, T, H, Hkv, D, S, hidden, width, bits, group_size, kv=None):
    """name -> (shape, dtype) of every operand but the offsets; ``kv``
    (kv_bits, kv_group_size, kv_hadamard): a quantized cache's six arrays."""
    def packed(name, rows, features):
        return {f"{name}_w": ((rows, features * bits // 32), "uint32"),
                f"{name}_scales": ((rows, features // group_size), "float16"),
                f"{name}_biases": ((rows, features // group_size), "float16")}

    out = {"h": ((B, T, hidden), "float32"), "input_norm": ((hidden,), "float32")}
    out.update(packed("qkv", (H + 2 * Hkv) * D, hidden))
    out.update(packed("o", hidden, H * D))
    out["post_norm"] = ((hidden,), "bfloat16")
    out.update(packed("gate_up", 2 * width, hidden))
    out.update(packed("down", hidden, width))
    if kv is None:
        out["k_cache"] = out["v_cache"] = ((B, Hkv, S, D), "float32")
        return out
    kv_bits, kv_group_size, _ = kv
    for kind in "kv":
        out[f"{kind}_values"] = ((B, Hkv, S, D * kv_bits // 32), "uint32")
        out[f"{kind}_scales"] = out[f"{kind}_biases"] = ((B, Hkv, S, D // kv_group_size),
                                                         "float32")
    return out


def cache_attrs(case) -> dict:
    """The layer's cache attributes for ``case`` (its ``kv``, if any)."""
    return {} if "kv" not in case else dict(zip(("kv_bits", "kv_group_size", "kv_hadamard"),
                                                case["kv"]))


def weights(rng, case) -> dict[str, mx.array]:
    """Random projections quantized as MLX does, random norms and caches."""
    H, Hkv, D, hidden, width = (case[k] for k in ("H", "Hkv", "D", "hidden", "width"))
    quant = dict(bits=case["bits"], group_size=case["group_size"])
    out = {}
    for name, rows, features in (("qkv", (H + 2 * Hkv) * D, hidden), ("o", hidden, H * D),
                                 ("gate_up", 2 * width, hidden), ("down", hidden, width)):
        w = mx.array((rng.standard_normal((rows, features)) / np.sqrt(features))
                     .astype(np.float32)).astype(mx.float16)
        out[f"{name}_w"], out[f"{name}_scales"], out[f"{name}_biases"] = mx.quantize(w, **quant)
    out["input_norm"] = mx.array(rng.uniform(0.5, 1.5, hidden).astype(np.float32))
    out["post_norm"] = mx.array(rng.uniform(0.5, 1.5, hidden).astype(np.float32)).astype(
        mx.bfloat16)
    return out


def layer_program(case, *, freqs=False, key_mask=True, qk_norm=False, **attrs) -> mp.Program:
    B, T, H, Hkv, D, S = (case[k] for k in ("B", "T", "H", "Hkv", "D", "S"))
    b = mp.ProgramBuilder("layer")
    named = {name: b.input(name, shape, dtype) for name, (shape, dtype) in shapes(
        B, T, H, Hkv, D, S, case["hidden"], case["width"], case["bits"],
        case["group_size"], case.get("kv")).items()}
    rest = [b.input("offset", (), "int32"), b.input("positions", (B,), "int32")]
    rest += [b.input("freqs", (D // 2,), "float32")] if freqs else []
    rest += [b.input(n, (D,), "float32") for n in ("q_norm", "k_norm")] if qk_norm else []
    rest += [b.input("key_mask", (B, S), "bool")] if key_mask else []
    outs = b.transformer_layer(*named.values(), *rest, heads=H, kv_heads=Hkv,
                               group_size=case["group_size"], bits=case["bits"], freqs=freqs,
                               **cache_attrs(case), **qk_norm_attrs(qk_norm), **attrs)
    return b.build(list(outs))


def qk_norm_attrs(qk_norm: bool) -> dict:
    """The per-head q/k norms' attribute (Qwen3's), when the case has them."""
    return {"qk_norm_eps": 1e-4} if qk_norm else {}


def separate_program(case, *, freqs=False, key_mask=True, numerics="exact", eps=1e-5,
                     qk_norm=False, **block) -> mp.Program:
    """The same layer from the ops it is defined by."""
    B, T, H, Hkv, D, S = (case[k] for k in ("B", "T", "H", "Hkv", "D", "S"))
    b = mp.ProgramBuilder("separate")
    n = {name: b.input(name, shape, dtype) for name, (shape, dtype) in shapes(
        B, T, H, Hkv, D, S, case["hidden"], case["width"], case["bits"],
        case["group_size"], case.get("kv")).items()}
    rest = [b.input("offset", (), "int32"), b.input("positions", (B,), "int32")]
    rest += [b.input("freqs", (D // 2,), "float32")] if freqs else []
    rest += [b.input(n, (D,), "float32") for n in ("q_norm", "k_norm")] if qk_norm else []
    rest += [b.input("key_mask", (B, S), "bool")] if key_mask else []
    quant = dict(group_size=case["group_size"], bits=case["bits"], transpose=True,
                 **({} if numerics == "exact" else {"numerics": numerics}))

    def qmm(x, name):
        return b.quantized_matmul(x, n[f"{name}_w"], n[f"{name}_scales"], n[f"{name}_biases"],
                                  **quant)

    x = b.fast_rms_norm(n["h"], n["input_norm"], eps=eps)
    caches = [v for name, v in n.items() if name[0] in "kv" and name[1] == "_"]
    attn, *caches = b.kv_cache_attention_block(qmm(x, "qkv"), *caches, *rest, heads=H,
                                               kv_heads=Hkv, freqs=freqs, **cache_attrs(case),
                                               **qk_norm_attrs(qk_norm), **block)
    h, x = b.fast_add_rms_norm(n["h"], qmm(attn, "o"), b.astype(n["post_norm"],
                                                                  dtype="float32"), eps=eps)
    out = b.add(h, qmm(b.fast_swiglu(qmm(x, "gate_up")), "down"))
    return b.build([out, *caches])


def arguments(rng, case, offset, positions, freqs=False, key_mask=True,
              qk_norm=False) -> list[mx.array]:
    B, Hkv, S, D = (case[k] for k in ("B", "Hkv", "S", "D"))
    w = weights(rng, case)
    args = {"h": mx.array(rng.standard_normal((B, case["T"], case["hidden"]))
                          .astype(np.float32)), **w}
    for kind in "kv":
        cache = mx.array(rng.standard_normal((B, Hkv, S, D)).astype(np.float32))
        if "kv" not in case:
            args[f"{kind}_cache"] = cache
            continue
        parts = AffineCache(*case["kv"]).encode(cache, kind)
        args.update({f"{kind}_{part}": a for part, a in zip(("values", "scales", "biases"),
                                                           parts)})
    order = list(shapes(B, case["T"], case["H"], Hkv, D, S, case["hidden"], case["width"],
                        case["bits"], case["group_size"], case.get("kv")))
    out = [args[name] for name in order]
    out += [mx.array(offset, mx.int32), mx.array(positions, mx.int32)]
    if freqs:
        out.append(mx.array((10000.0 ** (np.arange(D // 2) * 2 / D)).astype(np.float32)))
    if qk_norm:
        out += [mx.array(rng.uniform(0.5, 1.5, D).astype(np.float32)) for _ in range(2)]
    if key_mask:
        mask = rng.random((B, S)) > 0.25
        mask[:, 0] = True  # every query sees a key
        out.append(mx.array(mask))
    return out


SMOL = dict(B=1, T=1, H=9, Hkv=3, D=64, S=16, hidden=576, width=1536, bits=4, group_size=32)
CASES = [
    (SMOL, dict(offset=5, positions=[5])),                                    # SmolLM2's decode
    (dict(B=2, T=3, H=4, Hkv=2, D=16, S=8, hidden=64, width=128, bits=8, group_size=64),
     dict(offset=2, positions=[2, 0])),                                       # a prefill, 8 bits
    (dict(B=1, T=9, H=4, Hkv=1, D=32, S=12, hidden=128, width=128, bits=4, group_size=128),
     dict(offset=30, positions=[3], freqs=True)),                             # wide rows, clamped
    (dict(B=3, T=1, H=2, Hkv=2, D=16, S=6, hidden=64, width=64, bits=4, group_size=32),
     dict(offset=1, positions=[4, 1, 2], key_mask=False, traditional=True, base=500.0,
          rope_scale=0.5, scale=0.3, eps=1e-3)),
    (dict(SMOL, S=70, kv=(8, 64, True)), dict(offset=66, positions=[66])),     # an 8-bit cache
    (dict(B=2, T=3, H=4, Hkv=2, D=32, S=8, hidden=64, width=128, bits=8, group_size=64,
          kv=(4, 32, False)), dict(offset=2, positions=[2, 0])),              # 4-bit, a prefill
    (dict(B=2, T=3, H=8, Hkv=4, D=32, S=8, hidden=128, width=128, bits=4, group_size=32),
     dict(offset=2, positions=[2, 0], qk_norm=True)),                         # Qwen3's norms
]


def _split(options):
    options = dict(options)
    offset, positions = options.pop("offset"), options.pop("positions")
    operands = {k: options.pop(k) for k in ("freqs", "key_mask", "qk_norm") if k in options}
    return offset, positions, operands, options


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("case, options", CASES)
def test_layer_equals_its_ops(native, case, options):
    offset, positions, operands, attrs = _split(options)
    args = arguments(np.random.default_rng(0), case, offset, positions, **operands)
    layer = mp.compile(layer_program(case, **operands, **attrs), native=native)
    separate = mp.compile(separate_program(case, **operands, **attrs), native=native)
    for got, want in zip(layer(*args), separate(*args)):
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)
    assert layer.stats.native_ops == ({"transformer_layer": 1} if native else {})


@pytest.mark.parametrize("case, options", CASES[:2])
def test_int8_layer_equals_its_int8_ops_and_is_near_exact(case, options):
    offset, positions, operands, attrs = _split(options)
    args = arguments(np.random.default_rng(1), case, offset, positions, **operands)
    layer = mp.compile(layer_program(case, numerics="int8", **operands, **attrs), native=True)
    separate = mp.compile(separate_program(case, numerics="int8", **operands, **attrs),
                          native=True)
    exact = mp.compile(layer_program(case, **operands, **attrs), native=False)
    got, want, reference = layer(*args), separate(*args), exact(*args)
    for g, w in zip(got, want):  # the same kernels in the same order
        np.testing.assert_allclose(np.array(g), np.array(w), rtol=1e-5, atol=1e-5)
    # The activations' 8-bit rounding moves h by a fraction of its scale.
    err = np.abs(np.array(got[0]) - np.array(reference[0])).max()
    assert 0 < err < 0.05 * np.abs(np.array(reference[0])).max()
    assert not layer.stats.numerics_fallbacks


def test_layer_is_one_node_on_the_cpu():
    exe = mp.compile(layer_program(SMOL), native=True)
    exe(*arguments(np.random.default_rng(2), SMOL, 3, [3]))
    [segment] = exe.stats.segments
    assert segment.primitives.get("MlxprogTransformerLayer") == 1
    assert segment.nodes == 2  # the layer and the offset's clamp


def test_int8_without_native_kernels_computes_exactly_and_says_so():
    case = CASES[1][0]
    args = arguments(np.random.default_rng(3), case, 2, [2, 0])
    int8 = mp.compile(layer_program(case, numerics="int8"), native=False)
    exact = mp.compile(layer_program(case), native=False)
    for g, w in zip(int8(*args), exact(*args)):
        np.testing.assert_array_equal(np.array(g), np.array(w))
    [((op, reason), count)] = int8.stats.numerics_fallbacks.items()
    assert op == "quantized_matmul" and count == 4 and "native kernels are off" in reason


SMALL = dict(B=1, T=1, H=4, Hkv=2, D=16, S=6, hidden=64, width=64, bits=4, group_size=32)


def _loop(exe, args, steps, pipelined):
    """``steps`` decode steps feeding each step's caches to the next, with
    each step dispatched (``pipelined``: before the previous one is
    evaluated, as the engine does); the outputs of every step."""
    rng = np.random.default_rng(4)
    fixed = args[1:15]
    k, v = args[15], args[16]
    outs = []
    for step in range(steps):
        h = mx.array(rng.standard_normal((1, 1, SMALL["hidden"])).astype(np.float32))
        out, k, v = exe(h, *fixed, k, v, mx.array(step, mx.int32), mx.array([step], mx.int32))
        if pipelined:
            mx.async_eval(out, k, v)
        else:
            mx.eval(out, k, v)
        outs.append(out)
    return outs, (k, v)


@pytest.mark.parametrize("pipelined", [False, True])
def test_layer_updates_caches_in_a_decode_loop(pipelined):
    args = arguments(np.random.default_rng(5), SMALL, 0, [0], key_mask=False)
    args[15] = args[16] = mx.zeros((1, 2, 6, 16))
    layer = mp.compile(layer_program(SMALL, key_mask=False), native=True)
    separate = mp.compile(separate_program(SMALL, key_mask=False), native=False)
    got, got_caches = _loop(layer, args, 6, pipelined)
    want, want_caches = _loop(separate, args, 6, False)
    for a, b in zip(got + list(got_caches), want + list(want_caches)):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("keep", ["array", "view"])
def test_layer_never_writes_into_a_cache_the_caller_keeps(keep):
    """A cache (or a view of one, sharing its buffer) that the caller still
    holds keeps its values, also when the step is dispatched while the one
    that made the cache has not run yet."""
    args = arguments(np.random.default_rng(6), SMALL, 2, [2], key_mask=False)
    exe = mp.compile(layer_program(SMALL, key_mask=False), native=True)
    first = exe(*args)
    mx.async_eval(*first)
    kept = first[1] if keep == "array" else first[1][:, :, :4]
    if keep == "view":
        mx.eval(kept)  # a slice of an evaluated array shares its buffer
    step = [*args[:15], first[1], first[2], mx.array(3, mx.int32), mx.array([3], mx.int32)]
    before = np.array(kept)
    del first
    second = exe(*step)
    del step  # the step's caches are now held by the step alone (and `kept`)
    mx.eval(*second)
    np.testing.assert_array_equal(np.array(kept), before)
    written = np.array(second[1])[:, :, 3]
    assert not np.array_equal(written, np.array(args[15])[:, :, 3])


def _bad_layer(change: dict):
    case = dict(SMALL)
    specs = shapes(case["B"], change.get("T", 1), change.get("H", case["H"]), case["Hkv"],
                   case["D"], case["S"], case["hidden"], case["width"], case["bits"],
                   case["group_size"])
    specs.update(change.get("operands", {}))
    b = mp.ProgramBuilder("bad")
    named = [b.input(name, shape, dtype) for name, (shape, dtype) in specs.items()]
    rest = [b.input("offset", (), "int32"), b.input("positions", (1,), "int32")]
    b.transformer_layer(*named, *rest, heads=change.get("H", case["H"]), kv_heads=case["Hkv"],
                        group_size=change.get("group_size", case["group_size"]),
                        bits=change.get("bits", case["bits"]))


@pytest.mark.parametrize("change, message", [
    (dict(operands={"h": ((1, 1, 64), "int32")}), r"h must be a float16, bfloat16 or float32 \["),
    (dict(operands={"h": ((1, 1, 64), "float64")}), r"h must be a float16, bfloat16 or float32 \["),
    (dict(operands={"input_norm": ((32,), "float32")}), r"input_norm must be a float \[64\]"),
    (dict(operands={"qkv_w": ((100, 8), "uint32")}), r"qkv_w must be uint32\[128, 8\]"),
    (dict(operands={"o_scales": ((64, 3), "float16")}), r"o_scales must be .*\[64, 2\]"),
    (dict(operands={"gate_up_w": ((63, 8), "uint32")}), "gate_up_w's rows hold the gate"),
    (dict(operands={"down_biases": ((64, 2), "float64")}), "down_biases must be float16"),
    (dict(operands={"h": ((1, 1, 64), "bfloat16")}),
     "qkv_scales is float16, which would promote the layer's bfloat16 h"),
    (dict(group_size=128), "do not split into groups of 128"),
    (dict(H=3), "heads 3 is not a multiple of kv_heads 2"),
    (dict(T=9), "9 new tokens do not fit a cache of 6"),
    (dict(operands={"k_cache": ((1, 2, 6), "float32")}), r"k_cache must be \[B, kv_heads"),
])
def test_layer_validation_names_the_problem(change, message):
    with pytest.raises(mp.ValidationError, match=message):
        _bad_layer(change)


def test_layer_operand_count_is_named():
    b = mp.ProgramBuilder("short")
    h = b.input("h", (1, 1, 64), "float32")
    with pytest.raises(mp.ValidationError,
                       match=r"transformer_layer with freqs takes operands \(h, input_norm, "):
        b.transformer_layer(*([h] * 19), heads=4, kv_heads=2, freqs=True)
