"""The program model of format v1: pydantic models, JSON load/save and the schema.

These models check the *structure* of a document: field names and JSON
types. A document read by :meth:`Program.loads` (through the strict reader of
:mod:`.json_reader`) or :meth:`Program.from_dict` is validated in pydantic's
strict mode, so ``"1"`` is not an integer and ``true`` is not 1; models built
in Python validate as usual. What an instruction means (its op, operand
count, attributes, shapes) is checked by :mod:`mlxprog.validate` against the
op registry.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

import pydantic
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from typing_extensions import TypeAliasType

from ..arrays import DType
from ..errors import FormatError
from ..limits import MAX_DIM
from .json_reader import check_data, read_json

FORMAT = "mlxprog"
VERSION = 1

REF_KINDS = ("input", "capture", "const", "result", "carry")

NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

ConstValue = TypeAliasType(
    "ConstValue",
    Union[bool, int, float, Literal["nan", "inf", "-inf"], list["ConstValue"]],
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DimSpec(_Model):
    """Bounds of a named dim (inclusive); ``max`` None means unbounded."""

    min: int = Field(default=1, ge=0, le=MAX_DIM)
    max: int | None = Field(default=None, ge=0, le=MAX_DIM)

    @model_validator(mode="after")
    def _ordered(self) -> DimSpec:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max {self.max} is below min {self.min}")
        return self

    def contains(self, value: int) -> bool:
        """True when ``value`` lies within the bounds."""
        return value >= self.min and (self.max is None or value <= self.max)

    def describe(self) -> str:
        """The bounds as ``[min, max]``."""
        return f"[{self.min}, {'inf' if self.max is None else self.max}]"


class Ref(_Model):
    """A reference to a value: an object with exactly one key, ``input``,
    ``capture``, ``const``, ``result`` or ``carry``, and an integer index
    (``{"result": 3}``). Build one with :meth:`Ref.of`; each kind is a subclass,
    so validating a ref is a dictionary lookup, not Python code per ref."""

    kind: ClassVar[str]

    @property
    def index(self) -> int:
        """The position in the ref's namespace."""
        return getattr(self, self.kind)

    @classmethod
    def of(cls, kind: str, index: int) -> Ref:
        """Build a ref, e.g. ``Ref.of("result", 3)``."""
        if kind not in _REF_TYPES:
            raise ValueError(f"unknown ref kind {kind!r}; one of {', '.join(REF_KINDS)}")
        return _REF_TYPES[kind](**{kind: index})

    @classmethod
    def parse(cls, data: Any) -> Ref:
        """A ref from its JSON form (``{"result": 3}``); pydantic's
        ValidationError if it is not exactly one kind with an index >= 0."""
        return _REF_ADAPTER.validate_python(data)

    def __str__(self) -> str:
        return f"{self.kind} {self.index}"


class InputRef(Ref):
    """``{"input": i}``: the i-th program input."""

    kind: ClassVar[str] = "input"
    input: int = Field(ge=0)


class CaptureRef(Ref):
    """``{"capture": i}``: the i-th capture."""

    kind: ClassVar[str] = "capture"
    capture: int = Field(ge=0)


class ConstRef(Ref):
    """``{"const": i}``: the i-th constant."""

    kind: ClassVar[str] = "const"
    const: int = Field(ge=0)


class ResultRef(Ref):
    """``{"result": i}``: the i-th result of the same instruction list."""

    kind: ClassVar[str] = "result"
    result: int = Field(ge=0)


class CarryRef(Ref):
    """``{"carry": i}``: the i-th carry value of the enclosing subprogram."""

    kind: ClassVar[str] = "carry"
    carry: int = Field(ge=0)


_REF_TYPES: dict[str, type[Ref]] = {
    t.kind: t for t in (InputRef, CaptureRef, ConstRef, ResultRef, CarryRef)
}


def _ref_kind(value: Any) -> str | None:
    # Called for every ref of a program: the JSON case (a dict) is tested first.
    if isinstance(value, dict):
        return next(iter(value)) if len(value) == 1 else None
    return value.kind if isinstance(value, Ref) else None


_REF_SCHEMA = {
    "description": "a ref: exactly one of the kinds, with a non-negative index",
    "type": "object",
    "properties": {kind: {"type": "integer", "minimum": 0} for kind in REF_KINDS},
    "additionalProperties": False,
    "minProperties": 1,
    "maxProperties": 1,
}

AnyRef = Annotated[
    Union[tuple(Annotated[t, Tag(k)] for k, t in _REF_TYPES.items())],
    WithJsonSchema(_REF_SCHEMA),
    Discriminator(
        _ref_kind,
        custom_error_type="ref",
        custom_error_message="a ref is an object with exactly one key (input, capture, "
        "const, result or carry) and a non-negative integer index",
    ),
]
"""A field type accepting any kind of ref."""

_REF_ADAPTER: TypeAdapter[Ref] = TypeAdapter(AnyRef)


class TensorSpec(_Model):
    """A named array declared with its shape and dtype (an input or a capture).

    An input's shape entries may name a dim of the program's ``dims`` table or
    be an expression over dims (``"T"``, ``"2*T"``). An input with ``value_of``
    set is not passed by the caller: it is a scalar that receives the bound
    value of that dim on every call.
    """

    name: str = Field(min_length=1)
    shape: list[Annotated[int, Field(ge=0, le=MAX_DIM)] | str] = Field(
        description="dimension sizes (at most 2**31 - 1, MLX's bound): integers, or "
        "(inputs only) dim names/expressions"
    )
    dtype: DType
    value_of: str | None = Field(
        default=None, description="inputs only: receive the bound value of this dim"
    )


class Constant(_Model):
    """A scalar or a small nested list with a dtype. Non-finite floats are written
    as the strings ``"nan"``, ``"inf"`` and ``"-inf"``."""

    value: ConstValue
    dtype: DType

    @field_validator("value", mode="before")
    @classmethod
    def _check_value(cls, value: Any) -> Any:
        # One clear message instead of one per alternative of the union.
        _check_const_value(value, "")
        return value


def _check_const_value(value: Any, path: str) -> None:
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_const_value(item, f"{path}[{i}]")
    elif not isinstance(value, (bool, int, float)) and not (
        isinstance(value, str) and value in NONFINITE
    ):
        raise ValueError(
            'a constant is a number, a bool, "nan", "inf", "-inf" or a nested list of '
            f"them; found {value!r}" + (f" at value{path}" if path else "")
        )


class SubProgram(_Model):
    """The body of a structured op (``cond``/``body`` of ``while``, ``then``/``else``
    of ``cond``). It sees the enclosing inputs, captures and constants plus
    ``carry`` refs; its results are numbered locally."""

    instructions: list[Instruction] = Field(default_factory=list)
    outputs: list[AnyRef] = Field(default_factory=list)


class Instruction(_Model):
    """One op applied to operand refs, with named attributes (typed per op) and,
    for structured ops, named subprograms."""

    op: str = Field(min_length=1)
    operands: list[AnyRef] = Field(default_factory=list)
    attrs: dict[str, Any] = Field(default_factory=dict)
    subprograms: dict[str, SubProgram] = Field(default_factory=dict)


class Program(_Model):
    """A whole mlxprog program (format v1). See ``docs/format.md``."""

    format: Literal["mlxprog"] = FORMAT
    version: Literal[1] = VERSION
    name: str = ""
    world_size: int | None = Field(
        default=None, ge=1,
        description="the number of ranks the program runs on; required when an "
        "instruction uses a distributed op (see docs/distributed.md)",
    )
    dims: dict[str, DimSpec] = Field(default_factory=dict)
    inputs: list[TensorSpec] = Field(default_factory=list)
    captures: list[TensorSpec] = Field(default_factory=list)
    constants: list[Constant] = Field(default_factory=list)
    instructions: list[Instruction] = Field(default_factory=list)
    outputs: list[AnyRef] = Field(default_factory=list)

    @field_validator("captures")
    @classmethod
    def _static_captures(cls, captures: list[TensorSpec]) -> list[TensorSpec]:
        # Weights are bound by exact shape, once: no dims, no dim values.
        for i, spec in enumerate(captures):
            entry = next((d for d in spec.shape if isinstance(d, str)), None)
            if entry is not None:
                raise ValueError(f"capture {i} ({spec.name!r}): captures have static shapes "
                                 f"(integers; weights are bound by exact shape), found {entry!r}")
            if spec.value_of is not None:
                raise ValueError(f"capture {i} ({spec.name!r}): value_of is for inputs only")
        return captures

    # -- loading -------------------------------------------------------------
    @classmethod
    def loads(cls, text: str | bytes) -> Program:
        """Parse a program from JSON text (UTF-8 when bytes). Raises
        :class:`FormatError` on bad JSON or JSON the format forbids (see
        :mod:`.json_reader`), a foreign format tag, an unsupported version, or
        a malformed field."""
        with gc_paused():  # one pause for the parsed JSON and the models
            return cls._from_data(read_json(text))

    @classmethod
    def from_dict(cls, data: Any) -> Program:
        """Build a program from already-parsed JSON data, with the checks of
        :meth:`loads` that parsed data still shows: JSON types (strictly:
        lists, not tuples), nesting depth, no non-finite floats. Duplicate
        keys and number spellings were lost in parsing: parse with
        :meth:`loads` to have them checked."""
        check_data(data)
        return cls._from_data(data)

    @classmethod
    def _from_data(cls, data: Any) -> Program:
        if not isinstance(data, dict):
            raise FormatError(f"a program is a JSON object, found {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise FormatError(f'"format" must be "{FORMAT}", found {data.get("format")!r}')
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise FormatError(f'"version" must be an integer, found {version!r}')
        if version > VERSION:
            raise FormatError(
                f"program has format version {version}; this mlxprog reads version "
                f"{VERSION} (upgrade mlxprog to run it)"
            )
        if version < 1:
            raise FormatError(f"unknown format version {version}")
        try:
            with gc_paused():
                return cls.model_validate(data, strict=True)
        except pydantic.ValidationError as exc:
            raise FormatError(_describe(exc)) from None

    @classmethod
    def load(cls, path: str | Path) -> Program:
        """Read a program from a JSON file."""
        try:
            text = Path(path).read_bytes()
        except OSError as exc:
            raise FormatError(f"cannot read program file {str(path)!r}: {exc}") from None
        try:
            return cls.loads(text)
        except FormatError as exc:
            raise FormatError(f"{path}: {exc}") from None

    # -- saving --------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The program as JSON-ready data (non-finite floats as strings)."""
        data = self.model_dump(exclude_defaults=True)
        data["format"] = FORMAT
        data["version"] = VERSION
        data = {k: data[k] for k in sorted(data, key=_FIELD_ORDER.index)}
        return encode_nonfinite(data)

    def to_json(self, indent: int | None = None) -> str:
        """Serialise to JSON text; ``Program.loads(p.to_json()) == p``."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def save(self, path: str | Path) -> None:
        """Write the program to a JSON file, one declaration or instruction per
        line (readable, and diffs show which instruction changed)."""
        Path(path).write_text(self.to_pretty_json() + "\n")

    def to_pretty_json(self) -> str:
        """JSON text with each top-level field on its own line and each element
        of the top-level lists (inputs, instructions, ...) on its own line."""
        lines = []
        for key, value in self.to_dict().items():
            if key == "instructions":
                lines.append(f'  "instructions": {_pretty_list(value, 2, _pretty_instruction)}')
            elif isinstance(value, list):
                lines.append(f"  {json.dumps(key)}: {_pretty_list(value, 2, _dumps)}")
            else:
                lines.append(f"  {json.dumps(key)}: {_dumps(value)}")
        return "{\n" + ",\n".join(lines) + "\n}"

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """JSON Schema of the document structure as pydantic sees it; the
        schema for emitters, with per-op attributes, is
        :func:`mlxprog.format.schema.full_schema`."""
        return cls.model_json_schema()


_FIELD_ORDER = list(Program.model_fields)


@contextlib.contextmanager
def gc_paused():
    """Pause Python's cyclic garbage collector while building many long-lived
    objects at once (a large program's models or validated steps).

    Each collection it would trigger walks every object built so far and frees
    nothing. Re-enabling it alone is not enough: every object allocated during
    the pause is still in the youngest generation, so the next allocation
    would walk them all (docs/benchmarks.md, "Where the load + validate time
    goes", measures it).
    After a large build the young objects are therefore moved straight to the
    oldest generation, where they would end up anyway: ``gc.freeze()`` moves
    every tracked object to the permanent generation and resets the young
    count, ``gc.unfreeze()`` moves them into the oldest generation; both only
    relink lists. Skipped when the caller has frozen objects of its own.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        if enabled and gc.get_count()[0] > _PROMOTE_AFTER and not gc.get_freeze_count():
            gc.freeze()
            gc.unfreeze()
    finally:
        if enabled:
            gc.enable()


_PROMOTE_AFTER = 100_000
"""Young objects above which :func:`gc_paused` promotes them instead of letting
a collection walk them (about 10,000 instructions' worth)."""


def _dumps(value: Any, indent: int = 0) -> str:
    return json.dumps(value, allow_nan=False)


def _pretty_list(items: list, indent: int, render) -> str:
    if not items:
        return "[]"
    pad = " " * (indent + 2)
    body = ",\n".join(pad + render(item, indent + 2) for item in items)
    return "[\n" + body + "\n" + " " * indent + "]"


def _pretty_instruction(inst: dict[str, Any], indent: int) -> str:
    """One line per instruction; a structured op's subprograms are laid out
    below it, their instructions one per line."""
    subprograms = inst.get("subprograms")
    if not subprograms:
        return _dumps(inst)
    head = _dumps({k: v for k, v in inst.items() if k != "subprograms"})[:-1]
    pad = " " * (indent + 2)
    parts = []
    for name, sub in subprograms.items():
        body = _pretty_list(sub.get("instructions", []), indent + 2, _pretty_instruction)
        outputs = _dumps(sub.get("outputs", []))
        parts.append(f'{pad}{json.dumps(name)}: {{"instructions": {body}, "outputs": {outputs}}}')
    return head + ', "subprograms": {\n' + ",\n".join(parts) + "\n" + " " * indent + "}}"


def encode_nonfinite(value: Any) -> Any:
    """Replace non-finite floats (at any depth) by the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: encode_nonfinite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode_nonfinite(v) for v in value]
    return value


def _describe(exc: pydantic.ValidationError) -> str:
    lines = []
    for err in exc.errors()[:5]:
        loc = _location(err["loc"])
        lines.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}")
    more = exc.error_count() - len(lines)
    if more > 0:
        lines.append(f"... and {more} more")
    return "; ".join(lines)


_SINGULAR = {
    "instructions": "instruction",
    "outputs": "output",
    "operands": "operand",
    "inputs": "input",
    "captures": "capture",
    "constants": "constant",
}


def _location(loc: tuple) -> str:
    parts: list[str] = []
    rest = list(loc)
    while rest:
        item = rest.pop(0)
        # A list field followed by an index names one element; alone, the field.
        if item in _SINGULAR and rest and isinstance(rest[0], int):
            parts.append(f"{_SINGULAR[item]} {rest.pop(0)}")
        elif item == "subprograms" and rest:
            parts.append(f"subprogram {rest.pop(0)!r}")
        elif isinstance(item, str) and item.startswith(("function-", "list[", "union[")):
            continue
        else:
            parts.append(str(item))
    return " > ".join(parts) or "program"
