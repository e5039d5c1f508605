"""The native GGML expert kernel (``ggml_gather_matmul``'s, in
mlxprog/native/src/primitives/ggml_matmul.cpp) on every kernel table this
CPU runs and the portable one: against a float64 product of gguf's
dequantization (int8 numerics within the activations' rounding), and, int8,
bit for bit against the dense ``ggml_matmul`` kernel on each expert (the
same activation blocks, and the same dot products: one vec_dot per pair
for an expert with few slots, the int8 GEMM from kInt8GemmMinRows slots on,
as the dense kernel for as many rows); decode sizes (fewer slots than
experts) and prefill sizes (the slots grouped by expert), with an expert no
token chooses and one every token chooses; and the kernel against the op's
MLX path (native kernels off)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from ggml_blocks import activation_bound, random_blocks, reference
from helpers import one_op_program
from mlxprog.ggml import types as ggml_types

RNG = np.random.default_rng(380)
TYPES = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "MXFP4"]
TABLES = ["avx2+avx512vnni", "avx2+avxvnni", "avx2", "neon+dotprod", "portable"]
EXPERTS, SLOTS, ROWS = 8, 3, 40
INT8_GEMM_SLOTS = 16  # ggml_matmul.cpp's kInt8GemmMinRows
# (tokens, per_slot): a decode step, a prefill (expert 1 is in every
# token's first slot: more slots than either numerics' GEMM takes, the
# other experts fewer than the int8 one), and a prefill's down projection
# (one row of x per slot).
CASES = {"decode": (1, False), "decode-per-slot": (2, True), "prefill": (40, False),
         "prefill-per-slot": (12, True)}


@pytest.fixture(params=TABLES)
def table(request, ext):
    """Each kernel table this CPU runs (a table it cannot run is skipped)."""
    if request.param not in ext.isas():
        pytest.skip(f"this CPU or build has no {request.param} table")
    ext.set_isa(request.param)
    yield request.param
    ext.set_isa("best")


def inputs(type_name: str, case: str):
    """x, the experts' blocks and indices of a case: expert 0 chosen by no
    slot, expert 1 by every token's first."""
    t = ggml_types.BY_NAME[type_name]
    tokens, per_slot = CASES[case]
    features = max(256, 4 * t.block)
    x = RNG.standard_normal((tokens, SLOTS, features) if per_slot else (tokens, features))
    indices = RNG.integers(2, EXPERTS, (tokens, SLOTS)).astype(np.uint32)
    indices[:, 0] = 1
    w = random_blocks(RNG, type_name, EXPERTS * ROWS, features).reshape(EXPERTS, ROWS, -1)
    return x.astype(np.float32), w, indices, per_slot


def slot_rows(x: np.ndarray, indices: np.ndarray, per_slot: bool) -> np.ndarray:
    """Each slot's row of x, ``[tokens, k, K]``."""
    return x if per_slot else np.broadcast_to(x[:, None, :], (*indices.shape, x.shape[-1]))


def run(x, w, indices, type_name: str, numerics: str, per_slot: bool, native: bool = True):
    """The op in a compiled one-op program; checks which path ran."""
    program = one_op_program("ggml_gather_matmul", x, w, indices, type=type_name,
                             numerics=numerics, per_slot=per_slot)
    exe = mp.compile(program, native=native)
    y = exe(mx.array(x), mx.array(w), mx.array(indices))[0]
    mx.eval(y)
    assert ("ggml_gather_matmul" in exe.stats.native_ops) == native
    return np.array(y)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("numerics", ["exact", "int8"])
@pytest.mark.parametrize("type_name", TYPES)
def test_against_float64_product(table, type_name, numerics, case):
    t = ggml_types.BY_NAME[type_name]
    x, w, indices, per_slot = inputs(type_name, case)
    got = run(x, w, indices, type_name, numerics, per_slot)
    dense = reference(type_name, w.reshape(EXPERTS * ROWS, -1)).reshape(EXPERTS, ROWS, -1)
    rows = slot_rows(x, indices, per_slot).astype(np.float64)
    chosen = dense.astype(np.float64)[indices]
    want = np.einsum("tjk,tjnk->tjn", rows, chosen)
    bound = 1e-5 * np.einsum("tjk,tjnk->tjn", np.abs(rows), np.abs(chosen)) + 1e-6
    if numerics == "int8":
        bound += np.stack([[activation_bound(rows[i, j][None], dense[e], t)[0]
                            for j, e in enumerate(slots)] for i, slots in enumerate(indices)])
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) - bound)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("type_name", TYPES)
def test_int8_equals_the_dense_kernel_on_each_expert(table, type_name, case):
    """Each chosen expert's slots: the dense kernel's products of the same
    rows (one vec_dot per pair below INT8_GEMM_SLOTS rows, the int8 GEMM
    from there on; the prefill case has experts on both sides)."""
    x, w, indices, per_slot = inputs(type_name, case)
    got = run(x, w, indices, type_name, "int8", per_slot)
    rows = slot_rows(x, indices, per_slot)
    counts = [int((indices == e).sum()) for e in range(EXPERTS)]
    if case == "prefill":
        assert max(counts) >= INT8_GEMM_SLOTS and 0 < min(c for c in counts if c) < INT8_GEMM_SLOTS
    for e in range(EXPERTS):
        picked = indices == e
        if not picked.any():
            continue
        program = one_op_program("ggml_matmul", rows[picked], w[e], type=type_name)
        want = np.array(mp.run(program, mx.array(np.ascontiguousarray(rows[picked])),
                               mx.array(w[e]))[0])
        np.testing.assert_array_equal(got[picked], want)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("type_name", ["Q4_K", "IQ4_XS"])
def test_native_off_gives_the_exact_path(ext, type_name, case):
    x, w, indices, per_slot = inputs(type_name, case)
    on = run(x, w, indices, type_name, "exact", per_slot)
    off = run(x, w, indices, type_name, "exact", per_slot, native=False)
    # Float32 sums in another order: relative to the largest output.
    np.testing.assert_allclose(on, off, rtol=0, atol=2e-6 * np.abs(off).max() * x.shape[-1] ** 0.5)


def test_half_precision_activations_and_clamped_indices(ext):
    x, w, indices, _ = inputs("Q4_K", "decode")
    wild = np.array([[-1, 99, 2]], np.int32)
    got = run(mx.array(x).astype(mx.bfloat16), w, wild, "Q4_K", "exact", False)
    want = run(np.array(mx.array(x).astype(mx.bfloat16).astype(mx.float32)), w,
               np.array([[EXPERTS - 1, EXPERTS - 1, 2]], np.uint32), "Q4_K", "exact", False)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
