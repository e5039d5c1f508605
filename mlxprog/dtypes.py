"""The dtype names of format v1 and their MLX counterparts."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

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
