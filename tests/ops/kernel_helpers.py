"""Shared helpers of the LLM kernel tests (norms, activations, attention,
RoPE, sampling): random inputs, numpy views, tolerances and the
validation-error check."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from helpers import run_op

RNG = np.random.default_rng(0)


def randn(*shape, dtype=mx.float32) -> mx.array:
    """Standard normal values of ``shape`` (drawn in float32), as ``dtype``."""
    return mx.array(RNG.standard_normal(shape).astype(np.float32)).astype(dtype)


def as_np(a: mx.array) -> np.ndarray:
    """``a`` as a float64 numpy array (the references compute in float64)."""
    return np.array(a.astype(mx.float32), dtype=np.float64)


def check_invalid(match: str, op: str, *operands, **attrs) -> None:
    """Running ``op`` in a one-op program fails validation with a message
    that matches ``match`` and names instruction 0 and the op."""
    with pytest.raises(mp.ValidationError, match=match) as info:
        run_op(op, *operands, **attrs)
    assert "instruction 0" in str(info.value) and op in str(info.value)


# Tolerances by dtype: (rtol, atol).
TOL = {mx.float32: (1e-5, 1e-5), mx.float16: (5e-3, 5e-3), mx.bfloat16: (3e-2, 3e-2)}
