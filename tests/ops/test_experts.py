"""The mixture-of-experts ops (``moe_route``, ``gather_matmul``,
``gather_quantized_matmul``, ``ggml_gather_matmul``) against numpy
references: routing with both scorings, ties, NaN, experts no token picks
and one every token picks; the gathered matmuls per token and per slot,
with leading dims, in each dtype, decode and prefill sizes (the GGML one in
every numerics, on the native kernels and on MLX's ops); the operand checks;
and the ops from the builder and from a JSON program."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from ggml_blocks import activation_bound, random_blocks, reference
from helpers import assert_invalid, run_op
from mlxprog.ggml import types as ggml_types

RNG = np.random.default_rng(38)


def route_reference(logits: np.ndarray, top_k: int, scoring: str, renormalize: bool = False):
    """moe_route in float64 numpy: scores, a stable sort (equal scores by
    ascending expert), the weights."""
    z = logits.astype(np.float64)
    if scoring == "softmax_topk":
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        z = e / e.sum(axis=-1, keepdims=True)
    indices = np.argsort(-z, axis=-1, kind="stable")[..., :top_k]
    kept = np.take_along_axis(z, indices, axis=-1)
    if scoring == "topk_softmax":
        e = np.exp(kept - kept.max(axis=-1, keepdims=True))
        kept = e / e.sum(axis=-1, keepdims=True)
    elif renormalize:
        kept = kept / kept.sum(axis=-1, keepdims=True)
    return indices, kept


def route(logits, top_k: int, scoring: str, renormalize: bool = False):
    """moe_route run in a one-op program: (indices, weights) as numpy."""
    indices, weights = run_op("moe_route", logits, top_k=top_k, scoring=scoring,
                              renormalize=renormalize)
    assert indices.dtype == mx.uint32 and weights.dtype == mx.float32
    return np.array(indices), np.array(weights)


SCORINGS = [("softmax_topk", False), ("softmax_topk", True), ("topk_softmax", False)]
# The routing tests run on the native router and on MLX's ops.
route_paths = pytest.mark.usefixtures("native_and_mlx_ops")


@pytest.mark.parametrize("scoring,renormalize", SCORINGS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@route_paths
def test_route_against_numpy(scoring, renormalize, dtype):
    logits = mx.array(RNG.standard_normal((2, 5, 16)).astype(np.float32)).astype(
        getattr(mx, dtype))
    got_indices, got_weights = route(logits, 4, scoring, renormalize)
    want_indices, want_weights = route_reference(np.array(logits.astype(mx.float32)), 4,
                                                 scoring, renormalize)
    assert got_indices.shape == (2, 5, 4)
    np.testing.assert_array_equal(got_indices, want_indices)
    np.testing.assert_allclose(got_weights, want_weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scoring,renormalize", SCORINGS)
@route_paths
def test_route_ties_go_to_the_lower_expert(scoring, renormalize):
    logits = np.array([[0.5] * 8,                                 # all equal
                       [1, 3, 2, 3, 0, 3, 2, 1],                  # a three-way tie on top
                       [-0.0, 0.0, -1, -0.0, 5, 5, -2, 0.0]],     # equal zeros of both signs
                      np.float32)
    got_indices, got_weights = route(logits, 3, scoring, renormalize)
    np.testing.assert_array_equal(got_indices, [[0, 1, 2], [1, 3, 5], [4, 5, 0]])
    want_indices, want_weights = route_reference(logits, 3, scoring, renormalize)
    np.testing.assert_array_equal(got_indices, want_indices)
    np.testing.assert_allclose(got_weights, want_weights, rtol=1e-6)


@pytest.mark.parametrize("scoring,renormalize", SCORINGS)
@route_paths
def test_route_every_token_to_one_expert_and_one_to_none(scoring, renormalize):
    logits = RNG.standard_normal((6, 8)).astype(np.float32)
    logits[:, 5] = 20.0   # every token's first choice
    logits[:, 2] = -20.0  # no token's choice
    got_indices, got_weights = route(logits, 2, scoring, renormalize)
    assert np.all(got_indices[:, 0] == 5) and not np.any(got_indices == 2)
    want_indices, want_weights = route_reference(logits, 2, scoring, renormalize)
    np.testing.assert_array_equal(got_indices, want_indices)
    np.testing.assert_allclose(got_weights, want_weights, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("scoring,renormalize", SCORINGS)
@route_paths
def test_route_nan_logits_give_nan_weights(scoring, renormalize):
    logits = RNG.standard_normal((3, 8)).astype(np.float32)
    logits[1, 6] = np.nan
    got_indices, got_weights = route(logits, 2, scoring, renormalize)
    assert np.all(np.isnan(got_weights[1])), got_weights[1]
    assert np.all(got_indices < 8)
    clean = logits[[0, 2]]
    want_indices, want_weights = route_reference(clean, 2, scoring, renormalize)
    np.testing.assert_array_equal(got_indices[[0, 2]], want_indices)
    np.testing.assert_allclose(got_weights[[0, 2]], want_weights, rtol=1e-5)


def test_route_checks():
    logits = np.zeros((2, 4), np.float32)
    with pytest.raises(mp.ValidationError, match="instruction 0") as info:
        run_op("moe_route", logits, top_k=5, scoring="softmax_topk")
    assert "top_k" in str(info.value) and "4 experts" in str(info.value)
    assert_invalid("renormalize applies to scoring 'softmax_topk' only", "moe_route", logits,
                   top_k=2, scoring="topk_softmax", renormalize=True)
    assert_invalid("top_k", "moe_route", logits, top_k=0, scoring="softmax_topk")
    assert_invalid("scoring", "moe_route", logits, top_k=1, scoring="sigmoid")
    assert_invalid("logits must be", "moe_route", logits.astype(np.int32), top_k=1,
                   scoring="softmax_topk")


def slot_inputs(lead: tuple, k: int, experts: int, features: int, per_slot: bool):
    """x ``[*lead, K]`` (or ``[*lead, k, K]``) and indices ``[*lead, k]``
    that never pick expert 0 and put every token's first slot on expert 1."""
    x = RNG.standard_normal((*lead, k, features) if per_slot else (*lead, features))
    indices = RNG.integers(2, experts, (*lead, k)).astype(np.uint32)
    indices[..., 0] = 1
    return x.astype(np.float32), indices


def gathered_reference(x: np.ndarray, dense: np.ndarray, indices: np.ndarray,
                       per_slot: bool) -> np.ndarray:
    """float64 ``y[..., j, :] = x(_j) @ dense[indices[..., j]].T``."""
    rows = x if per_slot else np.broadcast_to(x[..., None, :], (*indices.shape, x.shape[-1]))
    return np.einsum("...jk,...jnk->...jn", rows.astype(np.float64),
                     dense.astype(np.float64)[indices])


# Leading dims of the tokens: one token without leading dims, a decode
# batch, and a prefill (more slots than the exact paths' sorting threshold).
LEADS = {"vector": (), "decode": (2, 1), "prefill": (3, 11)}


@pytest.mark.parametrize("lead", sorted(LEADS))
@pytest.mark.parametrize("per_slot", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_gather_matmul_against_numpy(lead, per_slot, dtype):
    x, indices = slot_inputs(LEADS[lead], 3, 6, 32, per_slot)
    w = RNG.standard_normal((6, 24, 32)).astype(np.float32)
    xd, wd = (mx.array(a).astype(getattr(mx, dtype)) for a in (x, w))
    got = run_op("gather_matmul", xd, wd, indices, per_slot=per_slot)
    assert got.dtype == mx.float32 and got.shape == (*indices.shape, 24)
    want = gathered_reference(np.array(xd.astype(mx.float32)), np.array(wd.astype(mx.float32)),
                              indices, per_slot)
    tol = 1e-4 if dtype == "float32" else 5e-2  # half products on a GPU
    np.testing.assert_allclose(np.array(got), want, rtol=tol, atol=tol)


@pytest.mark.usefixtures("native_and_mlx_ops")
@pytest.mark.parametrize("lead", sorted(LEADS))
@pytest.mark.parametrize("per_slot", [False, True])
@pytest.mark.parametrize("mode,bits", [("affine", 4), ("affine", 8), ("mxfp4", 4)])
def test_gather_quantized_matmul_against_numpy(lead, per_slot, mode, bits):
    x, indices = slot_inputs(LEADS[lead], 2, 5, 64, per_slot)
    parts = mx.quantize(mx.array(RNG.standard_normal((5, 16, 64)).astype(np.float32)),
                        group_size=32, bits=bits, mode=mode)
    dense = np.array(mx.dequantize(*parts, group_size=32, bits=bits, mode=mode)
                     .astype(mx.float32))
    got = run_op("gather_quantized_matmul", x, *parts, indices, group_size=32, bits=bits,
                 mode=mode, per_slot=per_slot)
    assert got.dtype == mx.float32 and got.shape == (*indices.shape, 16)
    want = gathered_reference(x, dense, indices, per_slot)
    np.testing.assert_allclose(np.array(got), want, rtol=1e-4, atol=1e-4)


def test_gathered_matmuls_clamp_indices():
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    w = RNG.standard_normal((4, 8, 16)).astype(np.float32)
    indices = np.array([[-1, 7], [0, 2]], np.int32)
    got = np.array(run_op("gather_matmul", x, w, indices))
    want = gathered_reference(x, w, np.array([[3, 3], [0, 2]]), False)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


GGML_TYPES = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "MXFP4"]
# (leading dims, per_slot): a decode step (fewer slots than experts), a
# prefill (tokens grouped by expert), and a prefill's down projection.
GGML_CASES = {"decode": ((1,), False), "decode-per-slot": ((2,), True),
              "prefill": ((4, 9), False), "prefill-per-slot": ((40,), True)}


@pytest.mark.usefixtures("native_and_mlx_ops")
@pytest.mark.parametrize("case", sorted(GGML_CASES))
@pytest.mark.parametrize("numerics", ["exact", "int8"])
@pytest.mark.parametrize("type_name", GGML_TYPES)
def test_ggml_gather_matmul_against_float64_product(type_name, numerics, case):
    t = ggml_types.BY_NAME[type_name]
    lead, per_slot = GGML_CASES[case]
    experts, k, n, features = 6, 3, 20, max(256, t.block * 4)
    x, indices = slot_inputs(lead, k, experts, features, per_slot)
    w = random_blocks(RNG, type_name, experts * n, features).reshape(experts, n, -1)
    got = run_op("ggml_gather_matmul", x, w, indices, type=type_name, numerics=numerics,
                 per_slot=per_slot)
    dense = reference(type_name, w.reshape(experts * n, -1)).reshape(experts, n, features)
    want = gathered_reference(x, dense, indices, per_slot)
    assert got.dtype == mx.float32 and got.shape == want.shape
    rows = x if per_slot else np.broadcast_to(x[..., None, :], (*indices.shape, features))
    magnitude = gathered_reference(np.abs(rows), np.abs(dense), indices, True)
    bound = 1e-5 * magnitude + 1e-6
    if numerics == "int8":
        bound = bound + _slot_activation_bound(rows, dense, indices, t)
    error = np.abs(np.array(got) - want)
    assert np.all(error <= bound), np.max(error - bound)


def _slot_activation_bound(rows: np.ndarray, dense: np.ndarray, indices: np.ndarray, t):
    """activation_bound of each slot's row with its expert's weights."""
    flat_rows = rows.reshape(-1, rows.shape[-1])
    flat_indices = indices.reshape(-1)
    bounds = [activation_bound(flat_rows[s:s + 1], dense[e], t)[0]
              for s, e in enumerate(flat_indices)]
    return np.array(bounds).reshape(*indices.shape, -1)


def test_ggml_gather_matmul_checks():
    w = random_blocks(RNG, "Q4_K", 12, 256).reshape(3, 4, -1)
    x = np.zeros((2, 256), np.float32)
    indices = np.zeros((2, 2), np.uint32)
    op = "ggml_gather_matmul"
    assert_invalid("w must be a 3-D uint8", op, x, w[0], indices, type="Q4_K")
    assert_invalid("whole Q4_K blocks", op, x, w[..., :100], indices, type="Q4_K")
    assert_invalid("x must be [..., K] [2, 256]", op, x[:, :128], w, indices, type="Q4_K")
    assert_invalid("x must be [..., k, K]", op, x, w, indices, type="Q4_K", per_slot=True)
    assert_invalid("indices must be an integer", op, x, w, indices.astype(np.float32),
                   type="Q4_K")
    assert_invalid("x must be [..., K] [3, 256]", op, x, w, np.zeros((3, 2), np.int32),
                   type="Q4_K")
    assert_invalid("x must be float16", op, x.astype(np.int32), w, indices, type="Q4_K")
    assert_invalid("type must be a GGML block type", op, x, w, indices, type="Q4_9")
    assert_invalid("w holds no expert", op, x, w[:0], indices, type="Q4_K")


def test_gather_matmul_checks():
    w = np.zeros((3, 4, 16), np.float32)
    x = np.zeros((2, 16), np.float32)
    indices = np.zeros((2, 2), np.uint32)
    assert_invalid("w must be float16, bfloat16 or float32 [E, N, K]", "gather_matmul", x,
                   w[0], indices)
    assert_invalid("x must be [..., K] [2, 16]", "gather_matmul", x[:, :8], w, indices)
    assert_invalid("x must be float16", "gather_matmul", x.astype(np.int32), w, indices)
    assert_invalid("indices must be an integer [..., k]", "gather_matmul", x, w,
                   np.zeros((), np.int32))


def test_gather_quantized_matmul_checks():
    parts = [np.array(p) for p in mx.quantize(mx.zeros((3, 8, 64)), group_size=32, bits=4)]
    x = np.zeros((2, 64), np.float32)
    indices = np.zeros((2, 2), np.uint32)
    op = "gather_quantized_matmul"
    assert_invalid("operands are (x, w, scales, biases, indices)", op, x, *parts[:2], indices,
                   group_size=32, bits=4)
    assert_invalid("scales must be float16, bfloat16 or float32 [3, 8, 2]", op, x, parts[0],
                   parts[1][..., :1], parts[2], indices, group_size=32, bits=4)
    assert_invalid("w must be uint32 [E, N, K * bits / 32]", op, x, parts[0][0], *parts[1:],
                   indices, group_size=32, bits=4)
    assert_invalid("x must be [..., K] [2, 64]", op, x[:, :32], *parts, indices, group_size=32,
                   bits=4)
    assert_invalid("mode 'affine' supports bits", op, x, *parts, indices, group_size=32, bits=7)


def test_builder_and_json_program():
    """The MoE block as the families write it, from the builder (moe_route's
    two results) and again from the program's JSON."""
    experts, k, hidden, ffn = 4, 2, 32, 16
    b = mp.ProgramBuilder("moe")
    h = b.input("h", [3, hidden], "float32")
    router = b.input("router", [hidden, experts], "float32")
    gate_up = b.input("gate_up", [experts, ffn, hidden], "float32")
    down = b.input("down", [experts, hidden, ffn], "float32")
    indices, weights = b.moe_route(b.matmul(h, router), top_k=k, scoring="softmax_topk",
                                   renormalize=True)
    g = b.gather_matmul(h, gate_up, indices)
    d = b.gather_matmul(b.multiply(g, g), down, indices, per_slot=True)
    out = b.sum(b.multiply(d, b.expand_dims(weights, axes=[-1])), axes=[-2])
    program = b.build([out])
    values = [RNG.standard_normal(s).astype(np.float32)
              for s in ((3, hidden), (hidden, experts), (experts, ffn, hidden),
                        (experts, hidden, ffn))]
    chosen, shares = route_reference(values[0] @ values[1], k, "softmax_topk", True)
    g = gathered_reference(values[0], values[2], chosen, False)
    want = (gathered_reference(g * g, values[3], chosen, True) * shares[..., None]).sum(-2)
    for prog in (program, mp.Program.loads(program.to_json())):
        got = mp.run(prog, *map(mx.array, values))[0]
        np.testing.assert_allclose(np.array(got), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("scoring,renormalize", SCORINGS)
def test_native_router_agrees_with_mlx_ops(scoring, renormalize):
    """The native router (one node) and MLX's ops pick the same experts,
    ties included (logits from a few values), with the same weights."""
    logits = RNG.integers(-3, 4, (64, 16)).astype(np.float32) / 2
    program = mp.ProgramBuilder("route")
    x = program.input("logits", list(logits.shape), "float32")
    program = program.build(list(program.moe_route(x, top_k=5, scoring=scoring,
                                                   renormalize=renormalize)))
    results = []
    for native in (True, False):
        exe = mp.compile(program, native=native)
        results.append([np.array(a) for a in exe(mx.array(logits))])
        assert ("moe_route" in exe.stats.native_ops) == native
    (native_indices, native_weights), (mlx_indices, mlx_weights) = results
    np.testing.assert_array_equal(native_indices, mlx_indices)
    np.testing.assert_allclose(native_weights, mlx_weights, rtol=1e-6, atol=1e-7)


def test_native_coverage_as_inspect_reports_it():
    """The ops' native_coverage rules (what ``mlxprog inspect`` says) ask the
    kernels' questions: the router and the GGML kernel for their float
    operands, the affine experts' kernel for the native quantized matmul's
    bits (4 or 8 in int8 numerics), not mxfp4."""
    from mlxprog.arrays import AVal

    def covered(op, avals, **attrs):
        spec = mp.lookup(op)
        return spec.native_coverage(avals, spec.attrs(**attrs))

    x, indices = AVal((3, 64), mx.float32), AVal((3, 2), mx.uint32)
    assert covered("moe_route", [AVal((3, 8), mx.bfloat16)], top_k=2, scoring="topk_softmax")
    blocks = AVal((4, 16, 2 * 18), mx.uint8)
    assert covered("ggml_gather_matmul", [x, blocks, indices], type="Q4_0")
    assert not covered("ggml_gather_matmul", [x, blocks, AVal((3, 2), mx.float32)], type="Q4_0")
    affine = [x, AVal((4, 16, 8), mx.uint32), AVal((4, 16, 2), mx.float16),
              AVal((4, 16, 2), mx.float16), indices]
    assert covered("gather_quantized_matmul", affine, group_size=32, bits=4, numerics="int8")
    assert covered("gather_quantized_matmul", affine, group_size=32, bits=4)
    three_bit = [x, AVal((4, 16, 6), mx.uint32), *affine[2:]]
    assert covered("gather_quantized_matmul", three_bit, group_size=32, bits=3)
    assert not covered("gather_quantized_matmul", three_bit, group_size=32, bits=3,
                       numerics="int8")
    mxfp4 = [x, AVal((4, 16, 8), mx.uint32), AVal((4, 16, 2), mx.uint8), indices]
    assert not covered("gather_quantized_matmul", mxfp4, mode="mxfp4")
