"""Typed attribute building blocks for op attribute models.

Every op declares a pydantic model for its attributes (subclass :class:`Attrs`).
Field names mirror ``mlx.core`` keyword names. The annotated types here add the
checks every op needs: axes normalised against the operand's rank (negative axes
allowed), dtype names, and floats that may be written as ``"nan"``/``"inf"``.

Axis normalisation reads the operand ranks from the validation context
(``{"ndims": [rank of operand 0, ...]}``), which :mod:`mlxprog.validate` passes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
)

from .dtypes import DTYPE_NAMES


class Attrs(BaseModel):
    """Base class of op attribute models: frozen, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class NoAttrs(Attrs):
    """The attributes of an op that takes none."""


def operand_ndim(info: ValidationInfo, operand: int = 0) -> int | None:
    """Rank of operand ``operand`` from the validation context, or None when the
    model is validated without one (e.g. when building docs)."""
    ctx = info.context or {}
    ndims = ctx.get("ndims")
    if ndims is None or operand >= len(ndims):
        return None
    return ndims[operand]


def normalize_axis(axis: int, ndim: int | None, what: str = "axis") -> int:
    """Map a possibly negative axis into ``[0, ndim)``; ValueError if out of range."""
    if ndim is None:
        return axis
    if not -ndim <= axis < ndim:
        raise ValueError(f"{what} {axis} is out of range for an operand of rank {ndim}")
    return axis % ndim if ndim else axis


def _axis(value: int, info: ValidationInfo) -> int:
    return normalize_axis(value, operand_ndim(info))


def _insert_axis(value: int, info: ValidationInfo) -> int:
    ndim = operand_ndim(info)
    return normalize_axis(value, None if ndim is None else ndim + 1)


def _axes(value: list[int], info: ValidationInfo) -> tuple[int, ...]:
    ndim = operand_ndim(info)
    axes = tuple(normalize_axis(a, ndim) for a in value)
    if len(set(axes)) != len(axes):
        raise ValueError(f"axes {list(value)} name an axis twice")
    return axes


def _float(value: Any) -> Any:
    if isinstance(value, str):
        if value in ("nan", "inf", "-inf"):
            return float(value)
        raise ValueError(f'a float is a number or one of "nan", "inf", "-inf"; found {value!r}')
    return value


def _dtype(value: str) -> str:
    if value not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {value!r}; known: {', '.join(DTYPE_NAMES)}")
    return value


_FLOAT_SCHEMA = {"anyOf": [{"type": "number"}, {"enum": ["nan", "inf", "-inf"]}]}

Axis = Annotated[int, AfterValidator(_axis)]
"""An axis of operand 0; negative values count from the end."""

InsertAxis = Annotated[int, AfterValidator(_insert_axis)]
"""An axis of a result one rank larger than operand 0 (``stack``, ``expand_dims``)."""

Axes = Annotated[list[int], AfterValidator(_axes)]
"""Distinct axes of operand 0, normalised to non-negative; a tuple after validation."""

Float = Annotated[
    Union[float, Literal["nan", "inf", "-inf"]], BeforeValidator(_float),
    WithJsonSchema(_FLOAT_SCHEMA),
]
"""A float that may be written as ``"nan"``, ``"inf"`` or ``"-inf"``."""

DType = Annotated[str, AfterValidator(_dtype), WithJsonSchema({"enum": list(DTYPE_NAMES)})]
"""A dtype name of format v1."""

Size = Annotated[int, Field(ge=0)]
"""A non-negative dimension size."""

PositiveInt = Annotated[int, Field(ge=1)]

