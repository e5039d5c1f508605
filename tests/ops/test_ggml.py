"""The GGML block ops (``ggml_matmul``, ``ggml_dequantize``) on every block
type: against gguf's own numpy dequantizer (bit for bit where the op
dequantizes, a float64 product of that dequantization for the matmul, with
the int8 numerics' bound from the activations' rounding), on the native
kernels and on MLX's ops; and the ops' operand checks."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from ggml_blocks import activation_bound
from ggml_blocks import random_blocks as _random_blocks
from ggml_blocks import reference
from helpers import assert_invalid, run_op
from mlxprog.ggml import types as ggml_types

pytestmark = pytest.mark.usefixtures("native_and_mlx_ops")

RNG = np.random.default_rng(7)
TYPES = ggml_types.BLOCK_TYPES


def random_blocks(type_name: str, rows: int, blocks_per_row: int) -> np.ndarray:
    """Rows of random valid blocks (see ggml_blocks.random_blocks)."""
    t = ggml_types.BY_NAME[type_name]
    return _random_blocks(RNG, type_name, rows, blocks_per_row * t.block)


@pytest.mark.parametrize("type_name", TYPES)
def test_dequantize_equals_gguf_bit_for_bit(type_name):
    t = ggml_types.BY_NAME[type_name]
    blocks = random_blocks(type_name, 6, 2).reshape(2, 3, -1)
    got = np.array(run_op("ggml_dequantize", blocks, type=type_name))
    want = reference(type_name, blocks.reshape(6, -1)).reshape(2, 3, 2 * t.block)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))


# One row (a decode step), a few, and enough for the exact numerics' GEMM
# path (a prefill), over more weight rows than one panel.
ROWS = {"decode": ((1,), 19), "batch": ((2, 3), 19), "prefill": ((3, 7), 150)}


@pytest.mark.parametrize("rows", sorted(ROWS))
@pytest.mark.parametrize("numerics", ["exact", "int8"])
@pytest.mark.parametrize("type_name", TYPES)
def test_matmul_against_float64_product(type_name, numerics, rows):
    t = ggml_types.BY_NAME[type_name]
    lead, out_rows = ROWS[rows]
    blocks_per_row = max(1, 512 // t.block)
    w = random_blocks(type_name, out_rows, blocks_per_row)
    x = RNG.standard_normal((*lead, blocks_per_row * t.block)).astype(np.float32)
    got = np.array(run_op("ggml_matmul", x, w, type=type_name, numerics=numerics))
    dense = reference(type_name, w).astype(np.float64)
    want = x.astype(np.float64) @ dense.T
    magnitude = np.abs(x).astype(np.float64) @ np.abs(dense).T
    assert got.dtype == np.float32 and got.shape == want.shape
    if numerics == "exact" or mx.default_device() != mx.cpu:
        bound = 1e-5 * magnitude + 1e-6
    else:
        # Each activation is rounded to 8 bits of its block's largest
        # magnitude: at most half a step (amax / 127 / 2) per element.
        bound = activation_bound(x, dense, t) + 1e-5 * magnitude + 1e-6
    assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) - bound)


def test_matmul_takes_half_precision_activations():
    w = random_blocks("Q4_K", 8, 2)
    x = RNG.standard_normal((1, 512)).astype(np.float32)
    want = np.array(run_op("ggml_matmul", x, w, type="Q4_K", numerics="exact"))
    got = np.array(run_op("ggml_matmul", mx.array(x).astype(mx.float16), w, type="Q4_K",
                          numerics="exact"))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def test_checks_name_the_operand():
    w = random_blocks("Q6_K", 4, 1)
    x = np.zeros((1, 256), np.float32)
    assert_invalid("type must be a GGML block type", "ggml_matmul", x, w, type="Q4_2")
    assert_invalid("whole Q6_K blocks", "ggml_matmul", x, w[:, :200], type="Q6_K")
    assert_invalid("x has 128 features", "ggml_matmul", x[:, :128], w, type="Q6_K")
    assert_invalid("w must be uint8", "ggml_matmul", x, w.astype(np.int32), type="Q6_K")
    assert_invalid("w must be a 2-D", "ggml_matmul", x, w[None], type="Q6_K")
    assert_invalid("x must be a float", "ggml_matmul", x.astype(np.int32), w, type="Q6_K")
    assert_invalid("blocks must be uint8", "ggml_dequantize", w[:, :100], type="Q6_K")


def test_native_type_table_matches_mlxprog_ggml_types():
    """The kernels' type list (native/src/quants/table.cpp) and
    mlxprog.ggml.types describe the same types the same way."""
    from mlxprog import native

    ext = native.module()
    if ext is None:
        pytest.skip("native kernels unavailable")
    want = sorted((t.id, t.name, t.block, t.block_bytes)
                  for t in ggml_types.BY_NAME.values() if t.name in TYPES)
    assert sorted(ext.ggml_types()) == want
