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



def _over_axes(suffix: str, span: str, default_axes: str) -> dict:
    """The four transforms over several axes (``fft2`` ... ``irfft2`` for
    ``suffix`` "2", ``fftn`` ... for "n"): their ``mx.fft`` functions and
    docs, which differ only in the span (``"2-D"``) and the default axes."""
    return {
        f"fft{suffix}": (getattr(mx.fft, f"fft{suffix}"),
                         f"Complex {span} FFT over ``axes`` (default {default_axes})."),
        f"ifft{suffix}": (getattr(mx.fft, f"ifft{suffix}"),
                          f"Inverse complex {span} FFT over ``axes``."),
        f"rfft{suffix}": (getattr(mx.fft, f"rfft{suffix}"),
                          f"{span} FFT of real input; the last of ``axes`` keeps "
                          "``s[-1] // 2 + 1`` frequencies."),
        f"irfft{suffix}": (getattr(mx.fft, f"irfft{suffix}"),
                           f"Inverse of ``rfft{suffix}``: a real result, sizes ``s`` (the "
                           "last axis defaults to ``2 * (size - 1)``)."),
    }


_TWO_AXES = _over_axes("2", "2-D", "the last two")
_ANY_AXES = _over_axes("n", "N-D", "all; ``s`` needs ``axes``")

register_family(_ONE_AXIS, _one_axis, attrs=FFTAttrs)
register_family(_TWO_AXES, _many_axes, attrs=FFT2Attrs)
register_family(_ANY_AXES, _many_axes, attrs=FFTNAttrs)
