"""The fused norms (mlxprog/ops/norms.py) against numpy references, run
through compiled programs."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from helpers import assert_close, run_op
from kernel_helpers import TOL, as_np, check_invalid, randn

# Every op here runs with native CPU kernels and with MLX's ops (conftest.py).
pytestmark = pytest.mark.usefixtures("native_and_mlx_ops")


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
