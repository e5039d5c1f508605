"""Rotary position embeddings (mlxprog/ops/rope.py) against numpy
references, run through compiled programs."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pydantic
import pytest

from helpers import assert_close, run_op
from kernel_helpers import RNG, TOL, as_np, check_invalid, randn
from mlxprog.ops.rope import RopeAttrs

# Every op here runs with native CPU kernels and with MLX's ops (conftest.py).
pytestmark = pytest.mark.usefixtures("native_and_mlx_ops")


def ref_rope(x, angles, dims, traditional, rotated_scale=1.0):
    """Rotate the first dims features of x, multiplied by rotated_scale, by
    angles (broadcast to [..., dims/2])."""
    x = np.concatenate([x[..., :dims] * rotated_scale, x[..., dims:]], axis=-1)
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


@pytest.mark.parametrize("dims", [D, 12])
@pytest.mark.parametrize("traditional", [False, True])
def test_fast_rope_with_freqs(traditional, dims):
    x, freqs = randn(B, H, T, D), mx.array(RNG.uniform(1, 100, dims // 2).astype(np.float32))
    got = run_op("fast_rope_with_freqs", x, freqs, mx.array([2, 9], mx.int32), dims=dims,
                 traditional=traditional, scale=0.5)
    positions = np.arange(T)[None, :] + np.array([2, 9])[:, None]
    angles = positions[:, None, :, None] * 0.5 / as_np(freqs)
    assert_close(got, ref_rope(as_np(x), angles, dims, traditional), 1e-4, 1e-4)


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


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
@pytest.mark.parametrize("dims", [D, 12])
@pytest.mark.parametrize("op", ["fast_rope", "fast_rope_with_freqs", "fast_rope_positions",
                                "fast_rope_with_freqs_positions"])
def test_rope_rotated_scale(op, dims, dtype):
    # The rotated features are scaled (by 1.19 here, Phi-3.5's LongRoPE
    # attention factor), the rest pass unchanged.
    freqs = mx.array(RNG.uniform(1, 100, dims // 2).astype(np.float32))
    inv_freq = (500.0 ** (-np.arange(0, dims, 2) / dims) if "freqs" not in op
                else 1 / as_np(freqs)) * 0.5
    attrs = {"dims": dims, "scale": 0.5, "rotated_scale": 1.19}
    if "freqs" not in op:
        attrs["base"] = 500.0
    if op.endswith("_positions"):
        x = randn(B, T, H, D, dtype=dtype)
        operands = [x, mx.array(LEFT_PADDED, mx.int32)] + ([freqs] if "freqs" in op else [])
        angles = LEFT_PADDED[:, :, None, None] * inv_freq
    else:
        x = randn(B, H, T, D, dtype=dtype)
        operands = [x] + ([freqs] if "freqs" in op else []) + [mx.array([2, 9], mx.int32)]
        positions = np.arange(T)[None, :] + np.array([2, 9])[:, None]
        angles = positions[:, None, :, None] * inv_freq
    got = run_op(op, *operands, **attrs)
    expected = ref_rope(as_np(x), angles, dims, False, rotated_scale=1.19)
    tolerance = (1e-4, 1e-4) if dtype == mx.float32 else TOL[dtype]
    assert_close(got, expected, *tolerance, dtype=dtype)
    np.testing.assert_array_equal(as_np(got)[..., dims:], as_np(x)[..., dims:])


def test_rotated_scale_is_mlx_lms_su_scaled_rope():
    from mlx_lm.models import rope_utils
    rope = rope_utils.SuScaledRoPE(12, base=10000.0, max_position_embeddings=131072,
                                   original_max_position_embeddings=4096,
                                   long_factor=[1.0 + i / 4 for i in range(6)])
    x = randn(B, H, T, D)
    got = run_op("fast_rope_with_freqs", x, rope._freqs, mx.array(7, mx.int32), dims=12,
                 rotated_scale=rope._scale)
    assert rope._scale != 1.0
    assert_close(got, np.array(rope(x, offset=mx.array(7, mx.int32))), 1e-5, 1e-5)


def test_rotated_scale_must_be_finite():
    check_invalid("rotated_scale", "fast_rope", randn(B, H, T, D), dims=8,
                  rotated_scale=float("nan"))


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
