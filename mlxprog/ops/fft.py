"""Discrete Fourier transforms, as ``mx.fft``: complex (``fft``), real-input
(``rfft``) and their inverses, over one axis, two axes or any set of axes.
Sizes ``n``/``s`` pad with zeros or truncate the transformed axes (default:
their sizes); ``norm`` picks the scaling (``"backward"``: none forward, ``1/n``
inverse; ``"ortho"``; ``"forward"``). Complex results are ``complex64`` (MLX
has no wider complex dtype).
"""

from __future__ import annotations

from typing import Literal

import mlx.core as mx
from pydantic import model_validator

from .attrs import Attrs, Axes, Axis, PositiveSize
from .registry import register_family

Norm = Literal["backward", "ortho", "forward"]


class FFTAttrs(Attrs):
    n: PositiveSize | None = None  # None: the size of ``axis``
    axis: Axis = -1
    norm: Norm = "backward"


class FFTNAttrs(Attrs):
    s: list[PositiveSize] | None = None  # None: the sizes of ``axes``
    axes: Axes | None = None  # None: all axes (only without s)
    norm: Norm = "backward"

    @model_validator(mode="after")
    def _check_sizes(self) -> FFTNAttrs:
        if self.s is None:
            return self
        if self.axes is None:
            raise ValueError(f"s={self.s} needs axes: the axes whose sizes s gives")
        if len(self.s) != len(self.axes):
            raise ValueError(
                f"s and axes must have the same length; found s={self.s}, "
                f"axes={list(self.axes)}"
            )
        return self


class FFT2Attrs(FFTNAttrs):
    axes: Axes = [-2, -1]

    @model_validator(mode="after")
    def _check_two_axes(self) -> FFT2Attrs:
        if len(self.axes) != 2:
            raise ValueError(f"expected 2 axes; found {list(self.axes)}")
        return self


def _one_axis(fn, operands, attrs):
    """A transform ``fn`` (``mx.fft.fft``, ...) of operand 0 along ``axis``."""
    return fn(operands[0], n=attrs.n, axis=attrs.axis, norm=attrs.norm)


def _many_axes(fn, operands, attrs):
    """A transform ``fn`` (``mx.fft.fftn``, ...) of operand 0 over ``axes``."""
    return fn(operands[0], s=attrs.s, axes=attrs.axes, norm=attrs.norm)


_ONE_AXIS = {
    "fft": (mx.fft.fft, "Complex FFT along ``axis``, padded or truncated to ``n``."),
    "ifft": (mx.fft.ifft, "Inverse complex FFT along ``axis`` (length ``n``)."),
    "rfft": (
        mx.fft.rfft,
        "FFT of real input along ``axis``: the ``n // 2 + 1`` non-negative frequencies "
        "(complex input is treated as its real part).",
    ),
    "irfft": (
        mx.fft.irfft,
        "Inverse of ``rfft``: a real result of length ``n`` along ``axis`` (default "
        "``2 * (size - 1)``).",
    ),
}

_TWO_AXES = {
    "fft2": (mx.fft.fft2, "Complex 2-D FFT over ``axes`` (default the last two)."),
    "ifft2": (mx.fft.ifft2, "Inverse complex 2-D FFT over ``axes``."),
    "rfft2": (
        mx.fft.rfft2,
        "2-D FFT of real input; the last of ``axes`` keeps ``s[-1] // 2 + 1`` frequencies.",
    ),
    "irfft2": (
        mx.fft.irfft2,
        "Inverse of ``rfft2``: a real result, sizes ``s`` (the last axis defaults to "
        "``2 * (size - 1)``).",
    ),
}

_ANY_AXES = {
    "fftn": (mx.fft.fftn, "Complex N-D FFT over ``axes`` (default all; ``s`` needs ``axes``)."),
    "ifftn": (mx.fft.ifftn, "Inverse complex N-D FFT over ``axes``."),
    "rfftn": (
        mx.fft.rfftn,
        "N-D FFT of real input; the last of ``axes`` keeps ``s[-1] // 2 + 1`` frequencies.",
    ),
    "irfftn": (
        mx.fft.irfftn,
        "Inverse of ``rfftn``: a real result, sizes ``s`` (the last axis defaults to "
        "``2 * (size - 1)``).",
    ),
}

register_family(_ONE_AXIS, _one_axis, attrs=FFTAttrs)
register_family(_TWO_AXES, _many_axes, attrs=FFT2Attrs)
register_family(_ANY_AXES, _many_axes, attrs=FFTNAttrs)
