"""Arrays as every layer sees them: the dtype names of format v1 and their
MLX counterparts, abstract values (shape and dtype without data), and the exact
conversion of Python values to arrays."""

from __future__ import annotations

from typing import Annotated, Any, NamedTuple

import mlx.core as mx
import numpy as np
from pydantic import AfterValidator, WithJsonSchema

DTYPES: dict[str, mx.Dtype] = {
    "bool": mx.bool_,
    "uint8": mx.uint8,
    "uint16": mx.uint16,
    "uint32": mx.uint32,
    "uint64": mx.uint64,
    "int8": mx.int8,
    "int16": mx.int16,
    "int32": mx.int32,
    "int64": mx.int64,
    "float16": mx.float16,
    "bfloat16": mx.bfloat16,
    "float32": mx.float32,
    "float64": mx.float64,
    "complex64": mx.complex64,
}

_NAMES: dict[mx.Dtype, str] = {dtype: name for name, dtype in DTYPES.items()}

DTYPE_NAMES: tuple[str, ...] = tuple(DTYPES)


def to_mlx(name: str) -> mx.Dtype:
    """Return the ``mx.Dtype`` for a format dtype name; ``KeyError`` if unknown."""
    return DTYPES[name]


def name_of(dtype: mx.Dtype) -> str:
    """Return the format name of an ``mx.Dtype`` (``mx.float32`` -> ``"float32"``)."""
    return _NAMES[dtype]


def is_floating(dtype: mx.Dtype) -> bool:
    """True for real and complex floating dtypes."""
    return mx.issubdtype(dtype, mx.inexact)


def is_integer(dtype: mx.Dtype) -> bool:
    """True for signed and unsigned integer dtypes (not bool)."""
    return mx.issubdtype(dtype, mx.integer)


_NUMPY_NAMES = {"bool": "bool_"}


def numpy_dtype(dtype: mx.Dtype) -> np.dtype:
    """The numpy dtype holding values of ``dtype`` (bfloat16 maps to float32)."""
    name = name_of(dtype)
    if name == "bfloat16":
        return np.dtype(np.float32)
    return np.dtype(getattr(np, _NUMPY_NAMES.get(name, name)))


def _dtype_name(value: str) -> str:
    if value not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {value!r}; known: {', '.join(DTYPE_NAMES)}")
    return value


DType = Annotated[str, AfterValidator(_dtype_name), WithJsonSchema({"enum": list(DTYPE_NAMES)})]
"""A dtype name of format v1 (a pydantic field type)."""


class AVal(NamedTuple):
    """An abstract value: the shape and dtype of an array, without its data."""

    shape: tuple[int, ...]
    dtype: mx.Dtype

    @classmethod
    def of(cls, array: mx.array) -> AVal:
        """The abstract value of an array."""
        return cls(tuple(array.shape), array.dtype)

    def __str__(self) -> str:
        return f"{name_of(self.dtype)}{list(self.shape)}"


def exact_array(value: Any, dtype: mx.Dtype) -> mx.array:
    """``value`` (a scalar or nested list) as an array of ``dtype``, refusing
    anything the conversion would change: ragged lists, fractions for integer
    dtypes, values out of the dtype's range. ValueError says which."""
    name = name_of(dtype)
    try:
        data = np.array(value)
    except ValueError:
        raise ValueError("value is a ragged nested list") from None
    if data.dtype == object:  # integers beyond 64 bits (ragged lists raise above)
        try:
            if not is_floating(dtype):
                raise OverflowError
            data = data.astype(np.float64)
        except (OverflowError, TypeError):
            raise ValueError(f"value out of range for {name}") from None
    if data.dtype.kind not in "biuf":
        raise ValueError(f"cannot convert {type(value).__name__} {value!r:.40} to {name}")
    if is_integer(dtype) or dtype == mx.bool_:
        if data.dtype.kind == "f":
            if not np.all(np.isfinite(data)) or np.any(data != np.round(data)):
                raise ValueError(f"non-integer value for dtype {name}")
        if dtype != mx.bool_ and data.size:
            info = np.iinfo(name)
            if data.min() < info.min or data.max() > info.max:
                raise ValueError(f"value out of range for {name} [{info.min}, {info.max}]")
    if dtype in _FLOAT_MAX and data.dtype.kind in "fiu" and data.size:
        finite = data[np.isfinite(data)].astype(np.float64)
        if finite.size and np.max(np.abs(finite)) > _FLOAT_MAX[dtype]:
            raise ValueError(f"value out of range for {name}")
    if dtype == mx.bfloat16:
        return mx.array(data.astype(np.float32)).astype(dtype)
    return mx.array(data, dtype=dtype)


# Largest finite values of the narrow float dtypes (numpy has no bfloat16).
_FLOAT_MAX = {
    mx.float16: float(np.finfo(np.float16).max),
    mx.bfloat16: 3.3895313892515355e38,
    mx.float32: float(np.finfo(np.float32).max),
}
