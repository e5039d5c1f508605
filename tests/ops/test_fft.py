"""FFT ops against numpy.fft, run in compiled one-op programs."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from helpers import assert_close, run_op

RNG = np.random.default_rng(0)
REAL = RNG.standard_normal((4, 6, 8)).astype(np.float32)
COMPLEX = (REAL + 1j * RNG.standard_normal((4, 6, 8))).astype(np.complex64)

TOL = {"rtol": 1e-4, "atol": 1e-4}


@pytest.mark.parametrize("op", ["fft", "ifft"])
@pytest.mark.parametrize("attrs", [{}, {"n": 5, "axis": 1}, {"n": 12, "axis": 0},
                                   {"axis": -2, "norm": "ortho"}])
def test_complex_one_axis(op, attrs):
    expected = getattr(np.fft, op)(COMPLEX, **attrs)
    assert_close(run_op(op, COMPLEX, **attrs), expected, dtype=mx.complex64, **TOL)


@pytest.mark.parametrize("attrs", [{}, {"n": 6, "axis": 0}, {"axis": 1, "norm": "forward"}])
def test_rfft_and_irfft(attrs):
    spectrum = np.fft.rfft(REAL, **attrs)
    assert_close(run_op("rfft", REAL, **attrs), spectrum, dtype=mx.complex64, **TOL)
    spectrum = spectrum.astype(np.complex64)
    expected = np.fft.irfft(spectrum, **attrs)
    assert_close(run_op("irfft", spectrum, **attrs), expected, dtype=mx.float32, **TOL)


@pytest.mark.parametrize("op", ["fft2", "ifft2", "fftn", "ifftn"])
@pytest.mark.parametrize("attrs", [{}, {"axes": [0, 2]}, {"s": [3, 10], "axes": [2, 0]},
                                   {"axes": [-1, 1], "norm": "ortho"}])
def test_complex_many_axes(op, attrs):
    expected = getattr(np.fft, op)(COMPLEX, **attrs)
    assert_close(run_op(op, COMPLEX, **attrs), expected, dtype=mx.complex64, **TOL)


@pytest.mark.parametrize("op", ["rfft2", "rfftn"])
@pytest.mark.parametrize("attrs", [{}, {"axes": [0, 1]}, {"s": [4, 6], "axes": [2, 1]}])
def test_real_many_axes_round_trip(op, attrs):
    inverse = "i" + op
    spectrum = getattr(np.fft, op)(REAL, **attrs)
    assert_close(run_op(op, REAL, **attrs), spectrum, dtype=mx.complex64, **TOL)
    spectrum = spectrum.astype(np.complex64)
    expected = getattr(np.fft, inverse)(spectrum, **attrs)
    assert_close(run_op(inverse, spectrum, **attrs), expected, dtype=mx.float32, **TOL)


def test_eager_matches_numpy():
    assert_close(run_op("fft2", REAL, eager=True), np.fft.fft2(REAL), **TOL)


@pytest.mark.parametrize(
    ("op", "attrs", "message"),
    [
        ("fft", {"axis": 3}, "axis 3 is out of range for an operand of rank 3"),
        ("rfft", {"n": 0}, "'n'"),
        ("fft2", {"axes": [0, 1, 2]}, "expected 2 axes"),
        ("ifft2", {"s": [4]}, "same length"),
        ("fftn", {"s": [4, 4], "axes": [0]}, "same length"),
        ("irfftn", {"s": [2, 2]}, "needs axes"),
        ("fftn", {"axes": [1, -2]}, "name an axis twice"),
        ("fft", {"norm": "none"}, "'norm'"),
    ],
)
def test_invalid_attrs(op, attrs, message):
    with pytest.raises(mp.ValidationError, match="instruction 0") as err:
        run_op(op, REAL, **attrs)
    assert message in str(err.value)
