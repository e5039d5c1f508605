"""Typed attribute building blocks for op attribute models.

Every op declares a pydantic model for its attributes (subclass :class:`Attrs`).
Field names mirror ``mlx.core`` keyword names. An attribute model checks the
attributes alone: it never sees the operands, so the op reference, the JSON
schema and validation all read the same model. What depends on the operands
lives elsewhere:

- an axis attribute is typed :data:`Axis`, :data:`Axes` (or another
  :class:`AxisOf` marker); validation normalises it against the rank of the
  operand the marker names (negative axes count from the end) and reports an
  axis out of range under the attribute's name (:func:`resolve_axes`);
- every other operand check is the op's ``check(avals, attrs)`` rule,
  registered beside it (see :func:`mlxprog.register_op`).
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Sequence, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    WithJsonSchema,
)

from ..arrays import AVal, DType  # noqa: F401  (DType is an attribute type too)
from ..limits import MAX_DIM


def _lax_sequences(schema: Any) -> None:
    """Mark every list and tuple schema inside ``schema`` (a pydantic core
    schema) lax, so it accepts the other kind; their items stay strict."""
    if isinstance(schema, dict):
        if schema.get("type") in ("list", "tuple"):
            schema["strict"] = False
        for value in schema.values():
            _lax_sequences(value)
    elif isinstance(schema, list):
        for value in schema:
            _lax_sequences(value)


class Attrs(BaseModel):
    """Base class of op attribute models: frozen, unknown keys rejected, and
    strict about JSON types (``"1"`` is not an integer, ``1`` not a bool,
    ``true`` not a number), while lists and tuples fill each other's fields
    (JSON has only lists; Python callers pass either)."""

    # For the import's sake (about 0.25 s of it, docs/benchmarks.md): each
    # model's validator is built on its first use (defer_build: a program
    # uses a few of ~90 models), and the docstrings under the fields, which
    # describe them in docs/ops.md and the JSON schema, are read by
    # attribute_docs when those ask, not by pydantic from the source of every
    # model as it is made.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> Any:
        schema = handler(source)
        _lax_sequences(schema)
        return schema


@functools.cache
def attribute_docs(model: type[Attrs]) -> dict[str, str]:
    """The description of each field of attribute model ``model``: its
    ``Field(description=...)``, else the string written on the line after the
    field's annotation (its docstring, cleaned as ``inspect.cleandoc`` does),
    inherited from the model's bases; fields without either are left out. A
    model whose source cannot be read (one made at run time) has only its
    explicit descriptions."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if isinstance(cls, type) and issubclass(cls, Attrs) and cls is not Attrs:
            docs.update(_field_docstrings(cls))
    for name, field in model.model_fields.items():
        if field.description:
            docs[name] = field.description
    return {name: docs[name] for name in model.model_fields if name in docs}


def _field_docstrings(cls: type) -> dict[str, str]:
    """The docstrings of the annotated fields in ``cls``'s own body."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return {}
    body = next((node.body for node in tree.body if isinstance(node, ast.ClassDef)), [])
    docs = {}
    for field, after in zip(body, body[1:]):
        if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[field.target.id] = inspect.cleandoc(after.value.value)
    return docs


class NoAttrs(Attrs):
    """The attributes of an op that takes none."""


class CheckError(ValueError):
    """An operand check failed (raised by ``check`` rules, axis resolution and
    host ops' ``infer``). ``attribute`` names the attribute the problem is
    about (the message then reads ``attribute 'axes': ...``); ``subprogram``
    names the subprogram it is in (the error is then located there). A plain
    ValueError from a rule is located at the instruction."""

    def __init__(self, message: str, attribute: str | None = None,
                 subprogram: str | None = None):
        super().__init__(message)
        self.attribute = attribute
        self.subprogram = subprogram


def normalize_axis(axis: int, ndim: int, what: str = "axis", of: str = "an operand") -> int:
    """Map a possibly negative axis into ``[0, ndim)``; ValueError if out of range."""
    if not -ndim <= axis < ndim:
        raise ValueError(f"{what} {axis} is out of range for {of} of rank {ndim}")
    return axis % ndim if ndim else axis


@dataclass(frozen=True)
class AxisOf:
    """Marks an attribute as an axis (``many``: a sequence of distinct axes) of
    operand ``operand``. Validation normalises it into ``[0, rank)`` where
    rank is the operand's rank plus ``added`` (plus the number of axes, with
    ``added_per_axis``: ``expand_dims`` counts in its result's rank), at least
    ``at_least``. ``what`` and ``of`` word the out-of-range error."""

    operand: int = 0
    many: bool = False
    added: int = 0
    added_per_axis: bool = False
    at_least: int = 0
    what: str = "axis"
    of: str = "an operand"

    def resolve(self, value: Any, avals: Sequence[AVal]) -> Any:
        """``value`` normalised against the operands' ranks (unchanged when the
        operand is absent: the arity check reports that)."""
        if value is None or self.operand >= len(avals):
            return value
        axes = value if self.many else (value,)
        rank = len(avals[self.operand].shape) + self.added
        rank = max(rank + (len(axes) if self.added_per_axis else 0), self.at_least)
        normalized = tuple(normalize_axis(a, rank, self.what, self.of) for a in axes)
        if not self.many:
            return normalized[0]
        if len(set(normalized)) != len(normalized):
            what = "axes" if self.what == "axis" else f"{self.what.removesuffix(' axis')} axes"
            raise ValueError(f"{what} {list(value)} name an axis twice")
        return normalized


def _distinct(value: list[int]) -> tuple[int, ...]:
    if len(set(value)) != len(value):
        raise ValueError(f"axes {list(value)} name an axis twice")
    return tuple(value)


def _float(value: Any) -> Any:
    if isinstance(value, str):
        if value in ("nan", "inf", "-inf"):
            return float(value)
        raise ValueError(f'a float is a number or one of "nan", "inf", "-inf"; found {value!r}')
    return value


_FLOAT_SCHEMA = {"anyOf": [{"type": "number"}, {"enum": ["nan", "inf", "-inf"]}]}

Axis = Annotated[int, AxisOf()]
"""An axis of operand 0; negative values count from the end."""

InsertAxis = Annotated[int, AxisOf(added=1)]
"""An axis of a result one rank larger than operand 0 (``stack``, ``expand_dims``)."""

Axes = Annotated[list[int], AfterValidator(_distinct), AxisOf(many=True)]
"""Distinct axes of operand 0, normalised to non-negative; a tuple after validation."""

Float = Annotated[
    Union[float, Literal["nan", "inf", "-inf"]], BeforeValidator(_float),
    WithJsonSchema(_FLOAT_SCHEMA),
]
"""A float that may be written as ``"nan"``, ``"inf"`` or ``"-inf"``."""

Size = Annotated[int, Field(ge=0, le=MAX_DIM)]
"""A dimension size: from 0 to the largest axis MLX can hold (``2**31 - 1``)."""

PositiveInt = Annotated[int, Field(ge=1)]
"""An integer of at least 1 (a count that never reaches MLX's shape code,
such as an iteration limit; use :data:`PositiveSize` for one that does)."""

# MLX's C++ shape code holds sizes, strides and positions in 32-bit ints: a
# Python int beyond that range aborts the process (std::terminate) or wraps
# into a nonsense size, so every integer attribute that reaches it is bounded
# here, where validation reports it under the attribute's name.

PositiveSize = Annotated[int, Field(ge=1, le=MAX_DIM)]
"""A size, count, stride or dilation of at least 1 (at most ``2**31 - 1``)."""

Offset = Annotated[int, Field(ge=-MAX_DIM, le=MAX_DIM)]
"""A position, start, shift or padding along an axis; negative allowed,
within ``±(2**31 - 1)``."""


def axis_fields(model: type[Attrs]) -> tuple[tuple[str, AxisOf], ...]:
    """The fields of an attribute model that hold axes, with their markers."""
    found = []
    for name, field in model.model_fields.items():
        marker = next((m for m in field.metadata if isinstance(m, AxisOf)), None)
        marker = marker or _marker_in(field.annotation)
        if marker is not None:
            found.append((name, marker))
    return tuple(found)


def _marker_in(annotation: Any) -> AxisOf | None:
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return next((m for m in annotation.__metadata__ if isinstance(m, AxisOf)), None)
    if origin in (Union, types.UnionType):
        return next(filter(None, map(_marker_in, typing.get_args(annotation))), None)
    return None


def resolve_axes(attrs: Attrs, fields: Sequence[tuple[str, AxisOf]],
                 avals: Sequence[AVal]) -> Attrs:
    """``attrs`` with its axis fields normalised against the operands' ranks;
    :class:`CheckError` naming the attribute when an axis is out of range."""
    update = {}
    for name, marker in fields:
        value = getattr(attrs, name)
        try:
            resolved = marker.resolve(value, avals)
        except ValueError as exc:
            raise CheckError(str(exc), attribute=name) from None
        if resolved != value:
            update[name] = resolved
    return attrs.model_copy(update=update) if update else attrs
