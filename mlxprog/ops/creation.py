"""Array creation: ``iota``, ``eye``, ``full``, ``arange``. These ops take no
operands; everything about the result is in their attributes.

``iota``, ``full`` and ``arange`` are shapeless (nothing in them depends on
input shapes); ``eye`` is not, as MLX builds it with a scatter whose shape a
shapeless trace cannot re-infer.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import mlx.core as mx
import numpy as np
from pydantic import PlainValidator, ValidationInfo, WithJsonSchema, field_validator

from ..arrays import is_integer, numpy_dtype, to_mlx
from .attrs import Attrs, DType, Offset, Size, normalize_axis
from .registry import register_op


def _scalar(value: Any) -> bool | int | float:
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, (bool, int, float)):
        return value
    raise ValueError(f'expected a number, a bool, or one of "nan", "inf", "-inf"; found {value!r}')


def _finite_number(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number; found {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number; found {value!r}")
    return value


# The Literal admits the strings in the annotation itself, so that symbolic
# programs do not read them as dim expressions.
Scalar = Annotated[
    bool | int | float | Literal["nan", "inf", "-inf"],
    PlainValidator(_scalar),
    WithJsonSchema({"anyOf": [{"type": "number"}, {"type": "boolean"},
                              {"enum": ["nan", "inf", "-inf"]}]}),
]
"""A number, a bool, or ``"nan"``/``"inf"``/``"-inf"`` (validated to a float)."""

FiniteNumber = Annotated[int | float, PlainValidator(_finite_number),
                         WithJsonSchema({"type": "number"})]


def _check_representable(value: bool | int | float, dtype_name: str) -> None:
    """Raise unless ``value`` converts to ``dtype_name`` without changing."""
    dtype = to_mlx(dtype_name)
    if dtype == mx.bool_ or is_integer(dtype):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{value!r} is not a whole number, as dtype {dtype_name} needs")
        if dtype == mx.bool_:
            if value not in (0, 1):
                raise ValueError(f"{value!r} is not a bool (or 0 or 1), as dtype bool needs")
            return
        info = np.iinfo(numpy_dtype(dtype))
        if not info.min <= value <= info.max:
            raise ValueError(
                f"{value!r} is out of range for {dtype_name} [{info.min}, {info.max}]"
            )
    elif mx.issubdtype(dtype, mx.floating) and math.isfinite(value):
        limit = float(np.finfo(numpy_dtype(dtype)).max)
        if abs(value) > limit:
            raise ValueError(f"{value!r} is out of range for {dtype_name}")


class IotaAttrs(Attrs):
    shape: list[Size]
    """The result shape."""
    dtype: DType = "int32"
    """The result dtype."""
    axis: int | None = None
    """The axis that counts, negative from the end; default: count through all
    elements."""

    @field_validator("axis")
    @classmethod
    def _in_shape(cls, axis: int | None, info: ValidationInfo) -> int | None:
        shape = info.data.get("shape")
        if axis is None or shape is None:
            return axis
        return normalize_axis(axis, len(shape), of="a result")


@register_op("iota", attrs=IotaAttrs, operands=0, shapeless=True)
def iota(operands, attrs):
    """An array of ``shape`` and ``dtype`` counting 0, 1, 2, ... along ``axis``
    (constant along the other axes), or, without ``axis``, through all elements
    in row-major order."""
    shape = attrs.shape
    if attrs.axis is None:
        counts = mx.reshape(mx.arange(math.prod(shape), dtype=mx.int32), shape)
    else:
        along = [1] * len(shape)
        along[attrs.axis] = shape[attrs.axis]
        counts = mx.broadcast_to(
            mx.reshape(mx.arange(shape[attrs.axis], dtype=mx.int32), along), shape
        )
    return counts.astype(to_mlx(attrs.dtype))


class EyeAttrs(Attrs):
    n: Size
    """Rows."""
    m: Size | None = None
    """Columns; default: ``n``."""
    k: Offset = 0
    """The diagonal of ones: 0 main, positive above, negative below."""
    dtype: DType = "float32"
    """The result dtype."""


@register_op("eye", attrs=EyeAttrs, operands=0)
def eye(operands, attrs):
    """An ``n`` x ``m`` (default ``n`` x ``n``) matrix of ``dtype``, ones on
    diagonal ``k`` (0: main, positive: above, negative: below), zeros elsewhere."""
    return mx.eye(attrs.n, attrs.m, attrs.k, dtype=to_mlx(attrs.dtype))


class FullAttrs(Attrs):
    shape: list[Size]
    """The result shape."""
    dtype: DType
    """The result dtype."""
    value: Scalar
    """The fill value; it must be representable in ``dtype``."""

    @field_validator("value")
    @classmethod
    def _representable(cls, value, info: ValidationInfo):
        if "dtype" in info.data:
            _check_representable(value, info.data["dtype"])
        return value


@register_op("full", attrs=FullAttrs, operands=0, shapeless=True)
def full(operands, attrs):
    """An array of ``shape`` and ``dtype`` with every element ``value`` (a number,
    a bool, or ``"nan"``/``"inf"``/``"-inf"``; it must be representable in
    ``dtype``)."""
    dtype = to_mlx(attrs.dtype)
    # Through numpy so that uint64 values above the int64 range convert exactly.
    fill = mx.array(np.asarray(attrs.value, dtype=numpy_dtype(dtype))).astype(dtype)
    return mx.full(attrs.shape, fill)


class ArangeAttrs(Attrs):
    start: FiniteNumber = 0
    """The first value."""
    stop: FiniteNumber
    """The end, excluded."""
    step: FiniteNumber = 1
    """The difference between consecutive values; nonzero."""
    dtype: DType | None = None
    """The result dtype; default: int32 when start, stop and step are integers,
    else float32."""

    @field_validator("step")
    @classmethod
    def _nonzero(cls, step):
        if step == 0:
            raise ValueError("step must be nonzero")
        return step

    @field_validator("dtype")
    @classmethod
    def _whole_for_integers(cls, dtype: str | None, info: ValidationInfo) -> str | None:
        if dtype is not None and is_integer(to_mlx(dtype)):
            for name in ("start", "stop", "step"):
                value = info.data.get(name)
                if value is not None and value != int(value):
                    raise ValueError(
                        f"{name} {value!r} is not a whole number, as dtype {dtype} needs"
                    )
        return dtype


@register_op("arange", attrs=ArangeAttrs, operands=0, shapeless=True)
def arange(operands, attrs):
    """Values ``start, start + step, ...`` below ``stop`` (above it for a negative
    ``step``), as ``mx.arange``. Without ``dtype``: int32 when all three are
    integers, else float32."""
    dtype = None if attrs.dtype is None else to_mlx(attrs.dtype)
    return mx.arange(attrs.start, attrs.stop, attrs.step, dtype=dtype)
