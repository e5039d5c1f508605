"""Array values for the worker: random inputs, conversions to and from MLX,
and exact comparison of results."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

_SPECIAL_FLOATS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e30, -1e30, 1e-30, 65504.0]

# Tolerances of compiled against eager results: fused kernels may round
# differently in the last bits, nothing more.
_RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-6, "complex64": 2e-6,
         "float64": 1e-13}


def decode_nonfinite(value: Any) -> Any:
    """A JSON value with the strings "nan", "inf", "-inf" read as floats."""
    if isinstance(value, str) and value in NONFINITE:
        return NONFINITE[value]
    if isinstance(value, list):
        return [decode_nonfinite(v) for v in value]
    return value


def random_array(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    """A random array of a format dtype (numpy float32 holding bfloat16
    values exactly for ``bfloat16``): mostly ordinary values, sometimes with
    special ones mixed in (NaN, infinities, signed zeros, extremes)."""
    shape = tuple(shape)
    size = int(np.prod(shape, dtype=np.int64)) if shape else 1
    special = rng.random() < 0.3
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("float16", "bfloat16", "float32", "float64", "complex64"):
        values = rng.standard_normal(size) * rng.choice([1.0, 3.0, 100.0])
        if special and size:
            picks = rng.integers(0, len(_SPECIAL_FLOATS), size)
            mask = rng.random(size) < 0.3
            values = np.where(mask, np.array(_SPECIAL_FLOATS)[picks], values)
        if dtype == "complex64":
            values = values + 1j * rng.standard_normal(size)
            return values.astype(np.complex64).reshape(shape)
        if dtype == "bfloat16":
            return round_bfloat16(values.astype(np.float32)).reshape(shape)
        with np.errstate(over="ignore"):
            return values.astype(dtype).reshape(shape)
    info = np.iinfo(dtype)
    low, high = (0, 8) if info.min == 0 else (-4, 4)
    values = rng.integers(low, high + 1, size, dtype=np.int64).astype(dtype)
    if special and size:
        extremes = np.array([info.min, info.max, 0, 1], dtype=dtype)
        mask = rng.random(size) < 0.3
        values = np.where(mask, extremes[rng.integers(0, 4, size)], values)
    return values.reshape(shape)


def round_bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even)."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    nan = np.isnan(values)
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(nan, np.float32(np.nan), out)


def to_mx(array: np.ndarray, dtype: str):
    """The numpy array as an mx.array of the format dtype. Zero-size arrays
    are built by MLX itself (MLX can hang on a zero-size array converted
    from numpy, which the harness must not trigger on its own)."""
    import mlx.core as mx

    mx_dtype = getattr(mx, "bool_" if dtype == "bool" else dtype)
    if array.size == 0:
        return mx.zeros(array.shape, mx_dtype)
    if dtype == "bfloat16":
        return mx.array(array.astype(np.float32)).astype(mx_dtype)
    return mx.array(array, dtype=mx_dtype)


def to_numpy(array) -> tuple[str, np.ndarray]:
    """An mx.array as ``(dtype name, numpy array)``; bfloat16 as float32."""
    import mlx.core as mx

    name = str(array.dtype).rsplit(".", 1)[-1]
    if array.dtype == mx.bfloat16:
        array = array.astype(mx.float32)
    return name, np.array(array, copy=True)


def difference(a: tuple[str, np.ndarray], b: tuple[str, np.ndarray]) -> str | None:
    """How two results differ (dtype, shape, NaN or infinity positions,
    values), or None when they are equal up to last-bit rounding."""
    (dtype_a, x), (dtype_b, y) = a, b
    if dtype_a != dtype_b:
        return f"dtype {dtype_a} vs {dtype_b}"
    if x.shape != y.shape:
        return f"shape {list(x.shape)} vs {list(y.shape)}"
    if x.dtype.kind in "biu":
        bad = x != y
    else:
        bad = _float_difference(x, y, _RTOL.get(dtype_a, 0.0))
    if not np.any(bad):
        return None
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"{int(np.sum(bad))} of {x.size} elements differ, first at {list(index)}: "
            f"{x[index]!r} vs {y[index]!r}")


def _float_difference(x: np.ndarray, y: np.ndarray, rtol: float) -> np.ndarray:
    if x.dtype.kind == "c":
        return _float_difference(x.real, y.real, rtol) | _float_difference(x.imag, y.imag, rtol)
    x, y = x.astype(np.float64), y.astype(np.float64)
    nan_x, nan_y = np.isnan(x), np.isnan(y)
    finite = np.isfinite(x) & np.isfinite(y)
    with np.errstate(invalid="ignore", over="ignore"):
        scale = np.maximum(np.abs(x), np.abs(y))
        close = np.abs(x - y) <= rtol * scale + 1e-30
    infinite_same = ~finite & ~nan_x & ~nan_y & (x == y)
    return (nan_x != nan_y) | (~nan_x & ~nan_y & ~(finite & close) & ~infinite_same)
