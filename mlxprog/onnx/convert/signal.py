"""Signal processing: HannWindow, HammingWindow, BlackmanWindow, DFT (opset 17
and 20), STFT and MelWeightMatrix (computed at import).

ONNX holds a complex tensor as a real one with a last axis of 2 (real,
imaginary); a real signal has a last axis of 1. The transforms here are
products with cosine and sine matrices built at import (in float64, with
the circle's symmetries exact, then the input's type): they keep that
layout and the input's type and precision (float64 too, where MLX's FFTs
compute in complex64), and take complex input without complex arithmetic.
They cost ``O(n**2)`` per transformed vector, which for the frame lengths
of speech and audio models is a small matrix product.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..context import Context
from ..dtypes import dtype_name, numpy_dtype
from ..registry import converter
from .elementwise import same_dtype
from .shape import _axis


# -- windows -----------------------------------------------------------------------------------

#: The cosine terms ``a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N)`` of each window.
_WINDOWS = {"HannWindow": (0.5, 0.5, 0.0), "HammingWindow": (25 / 46, 21 / 46, 0.0),
            "BlackmanWindow": (0.42, 0.5, 0.08)}


@converter(*_WINDOWS)
def window(ctx: Context) -> list:
    """The window of ``size`` samples (a symbolic size at run time: a known
    one is folded at import); ``periodic=1`` (default) divides by ``size``,
    ``periodic=0`` (symmetric) by ``size - 1``; ``output_datatype`` (default
    float) is the result's type."""
    periodic = ctx.choice("periodic", (0, 1), 1)
    out = numpy_dtype(ctx.attr("output_datatype", TensorProto.FLOAT), ctx.where)
    value = np.asarray(ctx.require_constant(0, "size"))
    if value.size != 1:
        raise ctx.fail(f"input 0 (size) must be a scalar; its shape is {list(value.shape)}")
    size = value.reshape(-1)[0]
    size = size if isinstance(size, str) else int(size)
    b = ctx.b
    compute = "float64" if out == np.float64 else "float32"
    n = b.iota(shape=[size], dtype=compute)
    denominator = b.astype(b.reshape(ctx.input(0), shape=[]), dtype=compute)
    if not periodic:
        denominator = b.subtract(denominator, b.constant(1, compute))
    phase = b.divide(b.multiply(n, b.constant(2 * np.pi, compute)), denominator)
    a0, a1, a2 = _WINDOWS[ctx.node.op_type]
    w = b.subtract(b.constant(a0, compute), b.multiply(b.constant(a1, compute), b.cos(phase)))
    if a2:
        second = b.cos(b.multiply(phase, b.constant(2, compute)))
        w = b.add(w, b.multiply(b.constant(a2, compute), second))
    return [w if dtype_name(out) == compute else b.astype(w, dtype=dtype_name(out))]


# -- DFT ---------------------------------------------------------------------------------------


def _weight(ctx: Context, what: str, array: np.ndarray):
    """``array`` (computed at import) as a program value of input 0's type."""
    array = np.asarray(array).astype(ctx.dtype(0))
    return ctx.known_value(f"{ctx.node.output[0]}.{what}", array)


def _unit_circle(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``cos`` and ``sin`` of ``2 pi a / n`` for ``a < n``, with the symmetries
    exact (``sin(2 pi (n - a) / n) == -sin(2 pi a / n)``, zeros at 0 and pi,
    ones at a quarter turn): the terms of a transform that cancel in exact
    arithmetic (the imaginary part of a real signal's Nyquist bin) then
    cancel in the matrix product too."""
    a = np.arange(n)
    cos, sin = np.cos(2 * np.pi * a / n), np.sin(2 * np.pi * a / n)
    mirror = a > n // 2
    cos[mirror], sin[mirror] = cos[n - a[mirror]], -sin[n - a[mirror]]
    if n % 2 == 0:
        cos[n // 2], sin[n // 2] = -1.0, 0.0
    if n % 4 == 0:
        cos[n // 4], sin[n // 4] = 0.0, 1.0
        cos[3 * n // 4], sin[3 * n // 4] = 0.0, -1.0
    sin[0] = 0.0
    return cos, sin


def _dft_matrices(rows: int, n: int, bins: int, inverse: bool, onesided: bool):
    """``cos`` and ``sin`` of ``2 pi k t / n`` for ``t < rows`` (the input
    length along the axis: rows at ``t >= n`` are zero, which truncates, and
    missing ones pad) and ``k < bins``, scaled for the inverse transforms
    (``1/n``; a one-sided inverse also counts each bin but 0 and ``n/2``
    twice, for its conjugate mirror, and its rows are frequencies)."""
    cos, sin = _unit_circle(n)
    i = np.arange(rows)[:, None]
    j = np.arange(bins)[None, :]
    turn = (i * j) % n
    if inverse and onesided:
        weight = np.where((i == 0) | (2 * i == n), 1.0, 2.0) * (i <= n // 2) / n
    else:
        weight = (i < n) / (n if inverse else 1.0)
    return cos[turn] * weight, sin[turn] * weight


def dft(ctx: Context, x, axis: int, n: int | None, inverse: bool, onesided: bool):
    """The DFT of ``x`` (``[..., 1|2]``: real or complex, ONNX's layout)
    along ``axis`` (not the last) with ``n`` points (None: the axis's size,
    or ``2 * (size - 1)`` for a one-sided inverse): ``[..., 2]``, or
    ``[..., 1]`` for a one-sided inverse (a real signal). Shared with STFT."""
    b = ctx.b
    shape = list(x.shape)
    rank = len(shape)
    if shape[-1] not in (1, 2):
        raise ctx.fail(f"the input's last axis must be 1 (real) or 2 (complex); "
                       f"its shape is {shape}")
    rows = shape[axis]
    if n is None:
        n = 2 * (rows - 1) if inverse and onesided else rows
    if n < 1:
        raise ctx.fail(f"dft_length must be positive (it is {n})")
    bins = n if inverse and onesided else (n // 2 + 1 if onesided else n)
    cos, sin = _dft_matrices(rows, n, bins, inverse, onesided)
    c, s = _weight(ctx, "dft_cos", cos), _weight(ctx, "dft_sin", sin)

    # The transformed axis last (a matrix product's), the real/imaginary axis dropped.
    order = [a for a in range(rank - 1) if a != axis] + [axis]
    back = [int(a) for a in np.argsort(order)]

    def part(i: int):
        piece = b.slice(x, lengths=shape[:-1] + [1], starts=[0] * (rank - 1) + [i])
        return b.transpose(b.squeeze(piece, axes=[rank - 1]), axes=order)

    re = part(0)
    im = part(1) if shape[-1] == 2 else None
    if inverse and onesided:
        # x_t = sum_k w_k (re_k cos - im_k sin): the Hermitian spectrum's real inverse.
        out = b.matmul(re, c)
        parts = [out if im is None else b.subtract(out, b.matmul(im, s))]
    else:
        # (re + i im)(cos + i sin), sin negated forward (the exponent's sign).
        real, imag = b.matmul(re, c), b.matmul(re, s)
        if not inverse:
            imag = b.negate(imag)
        if im is not None:
            im_s = b.matmul(im, s)
            real = b.subtract(real, im_s) if inverse else b.add(real, im_s)
            imag = b.add(imag, b.matmul(im, c))
        parts = [real, imag]
    return b.stack(*[b.transpose(p, axes=back) for p in parts], axis=rank - 1)


@converter("DFT")
def dft_(ctx: Context) -> list:
    """The discrete Fourier transform along ``axis`` (an attribute, default 1,
    before opset 20; input 2, default -2, from it), of ``dft_length`` points
    (input 1: pads or truncates the axis); ``inverse`` scales by ``1/n``;
    ``onesided`` keeps the ``n/2 + 1`` non-negative frequencies, or for an
    inverse takes them and gives the real signal."""
    inverse = bool(ctx.choice("inverse", (0, 1), 0))
    onesided = bool(ctx.choice("onesided", (0, 1), 0))
    rank = len(ctx.shape(0))
    if ctx.opset >= 20:
        axis = ctx.static(2, "axis")[0] if ctx.has_input(2) else -2
    else:
        axis = ctx.attr("axis", 1)
    axis = _axis(ctx, axis, rank)
    if axis == rank - 1:
        raise ctx.fail(f"axis {axis} is the real/imaginary axis; the DFT axis must be "
                       "another")
    n = ctx.static(1, "dft_length")[0] if ctx.has_input(1) else None
    return [dft(ctx, ctx.input(0), axis, n, inverse, onesided)]


@converter("STFT")
def stft(ctx: Context) -> list:
    """The short-time Fourier transform of ``signal`` (``[batch, length, 1|2]``):
    frames of ``frame_length`` samples (input 3, else the window's length)
    every ``frame_step`` samples (input 1, known at import), each multiplied
    by ``window`` (input 2, default ones) and transformed:
    ``[batch, frames, bins, 2]``; ``onesided=1`` (default) keeps
    ``frame_length/2 + 1`` bins."""
    onesided = bool(ctx.choice("onesided", (0, 1), 1))
    shape = list(ctx.shape(0))
    if len(shape) != 3 or shape[-1] not in (1, 2):
        raise ctx.fail(f"the signal must be [batch, length, 1|2]; its shape is {shape}")
    if not isinstance(shape[1], int):
        raise ctx.fail("the signal's length must be known at import")
    step = ctx.static(1, "frame_step")[0]
    if step < 1:
        raise ctx.fail(f"frame_step must be positive (it is {step})")
    if ctx.has_input(3):
        length = ctx.static(3, "frame_length")[0]
    elif ctx.has_input(2):
        length = ctx.shape(2)[0]
    else:
        raise ctx.fail("either window (input 2) or frame_length (input 3) is required")
    if not isinstance(length, int) or not 1 <= length <= shape[1]:
        raise ctx.fail(f"frame_length {length} must be in [1, {shape[1]}] (the signal's "
                       "length)")
    if ctx.has_input(2) and list(ctx.shape(2)) != [length]:
        raise ctx.fail(f"window must be [frame_length] = [{length}]; its shape is "
                       f"{list(ctx.shape(2))}")
    b = ctx.b
    frames = 1 + (shape[1] - length) // step
    index = np.arange(frames)[:, None] * step + np.arange(length)[None, :]
    idx = b.constant(index.reshape(-1).tolist(), "int32")
    x = b.take(ctx.input(0), idx, axis=1)
    x = b.reshape(x, shape=[shape[0], frames, length, shape[-1]])
    if ctx.has_input(2):
        w = b.reshape(ctx.input(2), shape=[1, 1, length, 1])
        x = b.multiply(x, same_dtype(ctx, w, x))
    return [dft(ctx, x, 2, length, False, onesided)]


@converter("MelWeightMatrix")
def mel_weight_matrix(ctx: Context) -> list:
    """Every input of MelWeightMatrix (bin counts, sample rate, frequency
    edges) decides its output, so a model's is computed at import (folded,
    as any node whose inputs are all known there); registering it lets such
    a model import. An input computed at run time is an error."""
    names = ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz",
             "upper_edge_hertz")
    for i, what in enumerate(names):
        ctx.require_constant(i, what)
    raise ctx.fail("the inputs are known at import, yet the node could not be computed "
                   "there (see ONNX's reference evaluator for why)")
