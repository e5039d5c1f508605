"""Convolutions against direct numpy loops, compiled (and a sample eagerly); the
conv + max-pool example program; zero-size kernels and channels (which killed
the process, so they run in a subprocess)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from mlxprog.arrays import AVal
from helpers import assert_close, assert_invalid, run_isolated, run_op

RNG = np.random.default_rng(11)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "maxpool_conv.json"


def _at(position, channels=slice(None)):
    """Index ``[:, *position, channels]`` of a channels-last array."""
    return (slice(None), *position, channels)


def np_conv_general(x, w, stride, padding, kernel_dilation, input_dilation, groups, flip):
    spatial, kernel = x.shape[1:-1], w.shape[1:-1]
    dilated = np.zeros((x.shape[0], *((d - 1) * r + 1 for d, r in zip(spatial, input_dilation)),
                        x.shape[-1]))
    dilated[_at([slice(None, None, r) for r in input_dilation])] = x
    padded = np.pad(dilated, [(0, 0), *padding, (0, 0)])
    if flip:
        w = w[_at([slice(None, None, -1)] * len(kernel))]
    out_spatial = [
        (p - (k - 1) * r - 1) // s + 1
        for p, k, r, s in zip(padded.shape[1:-1], kernel, kernel_dilation, stride)
    ]
    c_out, c_group = w.shape[0], w.shape[-1]
    per_group = c_out // groups
    out = np.zeros((x.shape[0], *out_spatial, c_out))
    for o in np.ndindex(*out_spatial):
        for k in np.ndindex(*kernel):
            pos = [oi * s + ki * r for oi, ki, s, r in zip(o, k, stride, kernel_dilation)]
            for g in range(groups):
                patch = padded[_at(pos, slice(g * c_group, (g + 1) * c_group))]
                taps = w[(slice(g * per_group, (g + 1) * per_group), *k, slice(None))]
                out[_at(o, slice(g * per_group, (g + 1) * per_group))] += patch @ taps.T
    return out


def np_conv_transpose(x, w, stride, padding, dilation, output_padding, groups):
    spatial, kernel = x.shape[1:-1], w.shape[1:-1]
    out_spatial = [
        (i - 1) * s - 2 * p + (k - 1) * d + op + 1
        for i, s, p, k, d, op in zip(spatial, stride, padding, kernel, dilation, output_padding)
    ]
    c_out, c_group = w.shape[0], w.shape[-1]
    per_group = c_out // groups
    out = np.zeros((x.shape[0], *out_spatial, c_out))
    for i in np.ndindex(*spatial):
        for k in np.ndindex(*kernel):
            pos = [ii * s + ki * d - p for ii, ki, s, d, p in zip(i, k, stride, dilation, padding)]
            if not all(0 <= q < n for q, n in zip(pos, out_spatial)):
                continue
            for g in range(groups):
                values = x[_at(i, slice(g * c_group, (g + 1) * c_group))]
                taps = w[(slice(g * per_group, (g + 1) * per_group), *k, slice(None))]
                out[_at(pos, slice(g * per_group, (g + 1) * per_group))] += values @ taps.T
    return out


def _data(x_shape, w_shape):
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = RNG.standard_normal(w_shape).astype(np.float32)
    return x, w


CONV_CASES = [
    # x shape, w shape, stride, padding, kernel_dilation, input_dilation, groups, flip
    ((2, 7, 3), (4, 3, 3), [1], [[0, 0]], [1], [1], 1, False),
    ((1, 9, 4), (6, 2, 2), [2], [[1, 2]], [3], [1], 2, False),
    ((1, 5, 2), (3, 3, 2), [1], [[2, 1]], [1], [2], 1, True),
    ((2, 6, 5, 4), (4, 3, 2, 2), [2, 1], [[1, 1], [0, 2]], [1, 2], [1, 1], 2, False),
    ((1, 4, 5, 3), (2, 2, 3, 3), [1, 2], [[1, 0], [2, 2]], [2, 1], [2, 2], 1, True),
    ((1, 4, 3, 4, 2), (2, 2, 2, 2, 2), [2, 1, 1], [[1, 0], [0, 0], [1, 1]], [1, 1, 2],
     [1, 2, 1], 1, False),
]


@pytest.mark.parametrize(
    "x_shape, w_shape, stride, padding, kernel_dilation, input_dilation, groups, flip", CONV_CASES
)
def test_conv_general(x_shape, w_shape, stride, padding, kernel_dilation, input_dilation,
                      groups, flip):
    x, w = _data(x_shape, w_shape)
    got = run_op("conv_general", x, w, stride=stride, padding=padding,
                 kernel_dilation=kernel_dilation, input_dilation=input_dilation, groups=groups,
                 flip=flip)
    expected = np_conv_general(x, w, stride, padding, kernel_dilation, input_dilation, groups,
                               flip)
    assert_close(got, expected, rtol=1e-4, atol=1e-4, dtype=mx.float32)


def test_conv_general_defaults_eager():
    x, w = _data((1, 5, 4, 3), (2, 3, 2, 3))
    got = run_op("conv_general", x, w, eager=True)
    expected = np_conv_general(x, w, [1, 1], [(0, 0)] * 2, [1, 1], [1, 1], 1, False)
    assert_close(got, expected, rtol=1e-4, atol=1e-4)


TRANSPOSE_CASES = [
    # x shape, w shape, stride, padding, dilation, output_padding, groups
    ((2, 5, 4), (3, 3, 4), [1], [0], [1], [0], 1),
    ((1, 4, 4), (6, 3, 2), [2], [1], [2], [1], 2),
    ((1, 3, 4, 2), (2, 2, 3, 2), [2, 3], [1, 0], [1, 2], [1, 2], 1),
    ((1, 2, 3, 2, 2), (4, 2, 1, 2, 2), [1, 2, 2], [0, 0, 1], [2, 1, 1], [0, 1, 0], 1),
    # padding above (k - 1) * dilation with stride > 1: MLX's result was too short
    ((1, 4, 3, 2), (4, 1, 2, 1), [2, 1], [1, 1], [1, 2], [0, 0], 2),
    ((2, 3, 4, 2, 2), (1, 1, 1, 2, 2), [2, 2, 2], [1, 0, 0], [1, 1, 1], [0, 0, 1], 1),
    ((1, 3, 0, 1), (2, 1, 3, 1), [2, 2], [1, 0], [1, 2], [1, 1], 1),
]


@pytest.mark.parametrize(
    "x_shape, w_shape, stride, padding, dilation, output_padding, groups", TRANSPOSE_CASES
)
def test_conv_transpose(x_shape, w_shape, stride, padding, dilation, output_padding, groups):
    x, w = _data(x_shape, w_shape)
    got = run_op("conv_transpose", x, w, stride=stride, padding=padding, dilation=dilation,
                 output_padding=output_padding, groups=groups)
    expected = np_conv_transpose(x, w, stride, padding, dilation, output_padding, groups)
    assert_close(got, expected, rtol=1e-4, atol=1e-4, dtype=mx.float32)


@pytest.mark.parametrize("eager", [False, True])
def test_conv_transpose_crops_after_dilating(eager):
    """Input element i lands at i * stride - padding: [1, 2, 3, 4] at -1, 1,
    3 and 5 of a length-5 result (MLX gave [2, 0, 3])."""
    x = np.arange(1, 5, dtype=np.float32).reshape(1, 4, 1)
    got = run_op("conv_transpose", x, np.ones((1, 1, 1), np.float32), stride=[2], padding=[1],
                 eager=eager)
    assert_close(got, np.array([0, 2, 0, 3, 0], np.float32).reshape(1, 5, 1))


def test_conv_transpose_defaults_eager():
    x, w = _data((1, 3, 3, 2), (2, 2, 2, 2))
    got = run_op("conv_transpose", x, w, eager=True)
    expected = np_conv_transpose(x, w, [1, 1], [0, 0], [1, 1], [0, 0], 1)
    assert_close(got, expected, rtol=1e-4, atol=1e-4)


X1 = np.zeros((1, 5, 4), np.float32)
W1 = np.zeros((2, 3, 4), np.float32)
X3 = np.zeros((1, 2, 2, 2, 2), np.float32)
X4 = np.zeros((1, 2, 2, 2, 2, 1), np.float32)

INVALID = [
    ("conv_general", [X1, np.zeros((2, 3, 3), np.float32)], {},
     "input channels 4 must equal the weight's last dimension 3 times groups 1"),
    ("conv_general", [X1, np.zeros((3, 3, 2), np.float32)], {"groups": 2},
     "output channels 3 must be divisible by groups 2"),
    ("conv_general", [X1, np.zeros((2, 1, 3, 4), np.float32)], {}, "of rank 3 like the input"),
    ("conv_general", [np.zeros((5, 4), np.float32), np.zeros((2, 4), np.float32)], {},
     "at least 1 spatial dimension(s)"),
    ("conv_general", [X1, W1], {"stride": [1, 1]},
     "stride needs one entry per spatial dimension (1); found 2"),
    ("conv_general", [X1, W1], {"padding": [[1, 1], [1, 1]]}, "padding needs one entry"),
    ("conv_general", [X1, W1], {"kernel_dilation": [0]}, "greater than or equal to 1"),
    ("conv_general", [X1, W1], {"padding": [[-1, 0]]}, "greater than or equal to 0"),
    ("conv_general", [X1, W1], {"groups": 0}, "greater than or equal to 1"),
    ("conv_general", [X1, W1], {"kernel_dilation": [3]}, "cannot be smaller than weight"),
    ("conv_transpose", [X4, np.zeros((1, 1, 1, 1, 1, 1), np.float32)], {},
     "with 1 to 3 spatial dimension(s)"),
    ("conv_transpose", [X1, np.zeros((2, 3, 2), np.float32)], {},
     "input channels 4 must equal the weight's last dimension 2"),
    ("conv_transpose", [X1, W1], {"output_padding": [0, 0]}, "output_padding needs one entry"),
    ("conv_transpose", [X1, W1], {"padding": [-1]}, "greater than or equal to 0"),
    ("conv_transpose", [X1, W1], {"input_dilation": [1]}, "unknown attribute"),
    ("conv_transpose", [X1, np.zeros((2, 1, 4), np.float32)], {"padding": [3]},
     "the result would have -1 elements along axis 1: (in - 1) * stride - 2 * padding"),
    ("conv_general", [X3, np.zeros((2, 1, 1, 1, 1), np.float32)], {"groups": 2},
     "groups != 1 in 1D or 2D"),
    ("conv_transpose", [X3, np.zeros((2, 1, 1, 1, 1), np.float32)], {"groups": 2},
     "groups != 1 in 1D or 2D"),
]


@pytest.mark.parametrize("op, operands, attrs, message", INVALID)
def test_invalid(op, operands, attrs, message):
    assert_invalid(message, op, *operands, **attrs)


def test_maxpool_conv_example():
    prog = mp.Program.load(EXAMPLE)
    assert mp.validate(prog).out_avals == [AVal((1, 4, 4, 4), mx.float32)]
    x, w = _data((1, 8, 8, 3), (4, 3, 3, 3))
    bias = RNG.standard_normal(4).astype(np.float32)
    weights = {"conv_weight": mx.array(w), "conv_bias": mx.array(bias)}
    (got,) = mp.run(prog, mx.array(x), captures=weights)
    conv = np_conv_general(x, w, [1, 1], [(1, 1)] * 2, [1, 1], [1, 1], 1, False)
    relu = np.maximum(conv + bias, 0)
    expected = relu.reshape(1, 4, 2, 4, 2, 4).max(axis=(2, 4))
    assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("op", "x_shape", "w_shape"),
    [("conv_general", (1, 5, 5, 2), (3, 0, 3, 2)), ("conv_general", (1, 5, 2), (3, 0, 2)),
     ("conv_transpose", (1, 4, 4, 2), (3, 2, 0, 2))],
)
def test_zero_size_kernel_is_rejected(op, x_shape, w_shape):
    """BLAS printed "parameter number 8 had an illegal value" and the process
    exited with status 0 in the middle of evaluation."""
    out = run_isolated(f"""
        x, w = np.ones({x_shape!r}, np.float32), np.ones({w_shape!r}, np.float32)
        try:
            one_op_program({op!r}, x, w)
        except mp.ValidationError as err:
            print(err)
    """)
    assert out.strip() == (f"instruction 0 ({op}): kernel sizes (weight axes 1 to "
                           f"{len(w_shape) - 2}) must be positive; found weight shape "
                           f"{list(w_shape)}")


@pytest.mark.parametrize(
    ("op", "x_shape", "w_shape", "attrs"),
    [
        ("conv_general", (1, 5, 5, 0), (3, 1, 3, 0), {}),  # SIGFPE
        ("conv_general", (2, 5, 0), (4, 3, 0), {"groups": 2, "stride": [2]}),  # SIGFPE
        ("conv_general", (1, 5, 5, 2), (0, 1, 3, 2), {"padding": [[1, 0], [0, 2]]}),  # BLAS
        ("conv_transpose", (1, 4, 0), (3, 2, 0), {"stride": [2]}),
        ("conv_transpose", (1, 4, 2), (0, 2, 2), {}),
    ],
)
def test_zero_channels_give_zeros(op, x_shape, w_shape, attrs):
    x, w = np.ones(x_shape, np.float32), np.ones(w_shape, np.float32)
    out = run_isolated(f"""
        x, w = np.ones({x_shape!r}, np.float32), np.ones({w_shape!r}, np.float32)
        for eager in (False, True):
            result = np.array(run_op({op!r}, x, w, eager=eager, **{attrs!r}))
            print(result.shape, result.dtype, bool((result == 0).all()))
    """)
    spatial = len(x_shape) - 2
    if op == "conv_general":
        padding = attrs.get("padding", [(0, 0)] * spatial)
        expected = np_conv_general(x, w, attrs.get("stride", [1] * spatial), padding,
                                   [1] * spatial, [1] * spatial, attrs.get("groups", 1), False)
    else:
        ones = [1] * spatial
        expected = np_conv_transpose(x, w, attrs.get("stride", ones), [0] * spatial, ones,
                                     [0] * spatial, 1)
    assert out.splitlines() == [f"{expected.shape} float32 True"] * 2
