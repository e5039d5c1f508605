"""The fused activations (mlxprog/ops/activations.py) against numpy
references, run through compiled programs."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from helpers import assert_close, run_op
from kernel_helpers import TOL, as_np, check_invalid, randn

# Every op here runs with native CPU kernels and with MLX's ops (conftest.py).
pytestmark = pytest.mark.usefixtures("native_and_mlx_ops")


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_fast_swiglu(dtype):
    gate, up = randn(4, 8, dtype=dtype), randn(4, 8, dtype=dtype)
    g = as_np(gate)
    expected = g / (1 + np.exp(-g)) * as_np(up)
    assert_close(run_op("fast_swiglu", gate, up), expected, *TOL[dtype], dtype=dtype)


def ref_gelu_tanh(x):
    """GELU's tanh approximation, in numpy."""
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def test_gelu_approx():
    x = randn(64) * 3
    assert_close(run_op("gelu_approx", x), ref_gelu_tanh(as_np(x)), 1e-5, 1e-6,
                 dtype=mx.float32)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("form", ["two", "halves", "broadcast"])
def test_fast_geglu(form, dtype):
    gate = randn(3, 4, 8, dtype=dtype) * 3
    up = randn(1, 8, dtype=dtype) if form == "broadcast" else randn(3, 4, 8, dtype=dtype)
    operands = [mx.concatenate([gate, up], axis=-1)] if form == "halves" else [gate, up]
    expected = ref_gelu_tanh(as_np(gate)) * as_np(up)
    assert_close(run_op("fast_geglu", *operands), expected, *TOL[dtype], dtype=dtype)


def test_fast_geglu_is_mlx_nn_gelu_approx_times_up():
    gate, up = randn(2, 16) * 4, randn(2, 16)
    assert_close(run_op("fast_geglu", mx.concatenate([gate, up], axis=-1)),
                 np.array(nn.gelu_approx(gate) * up), 1e-6, 1e-6)


@pytest.mark.parametrize("op", ["fast_swiglu", "fast_geglu"])
def test_gated_activations_invalid(op):
    check_invalid(r"gate float32\[4, 8\] and up float32\[4, 7\] do not broadcast", op,
                  randn(4, 8), randn(4, 7))
    check_invalid(r"halves of its last axis, which must have an even length; found "
                  r"float32\[4, 7\]", op, randn(4, 7))
    check_invalid("even length; found float32", op, mx.array(1.0))
