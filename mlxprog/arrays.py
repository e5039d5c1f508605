"""Arrays as every layer sees them: the dtype names of format v1 and their
MLX counterparts, abstract values (shape and dtype without data), the exact
conversion of Python values to arrays, and what counts as an integer value."""

from __future__ import annotations

import math
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


def is_int(value: Any) -> bool:
    """Whether ``value`` is a Python integer (a bool is not one): what a
    setting that counts something must be."""
    return isinstance(value, int) and not isinstance(value, bool)


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


def _is_numpy_bfloat16(found: np.dtype) -> bool:
    # ml_dtypes' bfloat16 (the type onnx, JAX and others hand out), told by
    # its name so that mlxprog does not need ml_dtypes installed.
    return found.name == "bfloat16" and found.itemsize == 2


def numpy_fits(found: np.dtype, dtype: mx.Dtype) -> bool:
    """True when a numpy array of dtype ``found`` holds values of ``dtype``
    exactly: ``numpy_dtype(dtype)``, or for bfloat16 also ml_dtypes'
    bfloat16."""
    return found == numpy_dtype(dtype) or (dtype == mx.bfloat16 and _is_numpy_bfloat16(found))


def from_numpy(value: np.ndarray, dtype: mx.Dtype) -> mx.array:
    """The numpy array ``value`` (of a dtype :func:`numpy_fits` accepts) as
    an array of ``dtype``, of any strides; an ml_dtypes bfloat16 array keeps
    its bits."""
    if not value.flags.c_contiguous:
        # MLX refuses a view with negative strides (``a[::-1]``). (Not
        # np.ascontiguousarray: it makes a 0-d array 1-d.)
        value = value.copy(order="C")
    if _is_numpy_bfloat16(value.dtype):
        return mx.array(value.view(np.uint16)).view(mx.bfloat16)
    return mx.array(value, dtype=dtype)


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
    dtypes, values out of the dtype's range (bool holds 0 and 1). ValueError
    says which. The one conversion of Python values: constants, call inputs,
    captures and callback results all come through here."""
    name = name_of(dtype)
    data = _numpy(value, name)
    if data.size == 0:
        # MLX 0.32 can hang reducing a zero-size array converted from numpy
        # (after a compiled reduction); one MLX makes itself is safe.
        return mx.zeros(data.shape, dtype)
    if is_integer(dtype) or dtype == mx.bool_:
        return mx.array(_exact_integers(value, data, name), dtype=dtype)
    if data.dtype == object:  # integers beyond 64 bits
        try:
            data = data.astype(np.float64)
        except OverflowError:
            raise ValueError(f"value out of range for {name}") from None
    if dtype in _FLOAT_MAX:
        finite = data[np.isfinite(data)].astype(np.float64)
        if finite.size and np.max(np.abs(finite)) > _FLOAT_MAX[dtype]:
            raise ValueError(f"value out of range for {name}")
    if dtype == mx.bfloat16:
        return mx.array(data.astype(np.float32)).astype(dtype)
    return mx.array(data, dtype=dtype)


def _numpy(value: Any, name: str) -> np.ndarray:
    """``value`` as numpy infers it: bool, integer, float or (integers beyond
    64 bits) object elements."""
    try:
        data = np.array(value)
    except ValueError as exc:
        if "maximum number of dimension" in str(exc):
            raise ValueError("value nests lists deeper than 64 levels") from None
        raise ValueError("value is a ragged nested list") from None
    if data.dtype.kind not in "biufO":
        raise ValueError(f"cannot convert {type(value).__name__} {value!r:.40} to {name}")
    return data


def _exact_integers(value: Any, data: np.ndarray, name: str) -> np.ndarray:
    """The elements of ``value`` (inferred by numpy as ``data``) as exact
    integers within the range of dtype ``name``; ValueError otherwise.

    Numpy infers float64 for a list that mixes integers with floats or with
    integers of both signs beyond int64 (``[2**64 - 1, -1]``): where that can
    have rounded an integer (a magnitude of 2**53 or more), every element is
    converted from its Python value instead.
    """
    low, high = (0, 1) if name == "bool" else (int(np.iinfo(name).min), int(np.iinfo(name).max))
    if data.dtype.kind == "b":
        # Numpy raises OverflowError comparing a bool with an int beyond int64.
        data = data.astype(np.uint8)
    if data.dtype.kind == "O" or (data.dtype.kind == "f" and not np.max(np.abs(data)) < 2.0**53):
        data = np.array([_integer(x, name) for x in np.array(value, dtype=object).flat],
                        dtype=object).reshape(data.shape)
    elif data.dtype.kind == "f" and np.any(fractions := data != np.round(data)):
        first = float(data[fractions].flat[0])
        raise ValueError(f"non-integer value for dtype {name}: {first!r}")
    if data.min() < low or data.max() > high:
        raise ValueError(f"value out of range for {name} [{low}, {high}]")
    return data.astype(numpy_dtype(to_mlx(name)))


def _integer(element: Any, name: str) -> int:
    if isinstance(element, (float, np.floating)):
        if not (math.isfinite(element) and float(element).is_integer()):
            raise ValueError(f"non-integer value for dtype {name}: {element!r}")
    elif not isinstance(element, (int, np.integer, np.bool_)):
        raise ValueError(f"cannot convert {element!r:.40} to {name}")
    return int(element)


# Largest finite values of the narrow float dtypes (numpy has no bfloat16).
_FLOAT_MAX = {
    mx.float16: float(np.finfo(np.float16).max),
    mx.bfloat16: 3.3895313892515355e38,
    mx.float32: float(np.finfo(np.float32).max),
}
