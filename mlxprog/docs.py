"""The op reference (``docs/ops.md``), generated from the op registry.

``render_op_reference()`` writes one section per op family and one entry per op:
its operand and result counts, an attribute table (JSON-level types and
defaults) and the implementation's docstring. ``mlxprog ops --markdown`` prints
it; ``tests/test_docs.py`` fails when the checked-in file is stale.
"""

from __future__ import annotations

import collections.abc
import json
import sys
import types
import typing
from collections import Counter
from typing import Annotated, Any, Literal, Mapping, NamedTuple, Union

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from .format.program import encode_nonfinite
from .ops.attrs import Axes, Axis, DType, Float, InsertAxis, Size, attribute_docs
from .ops.registry import OpSpec, all_ops

REGENERATE = "mlxprog ops --markdown > docs/ops.md"
"""The command that rewrites ``docs/ops.md``."""

# Annotated attribute types of mlxprog.ops.attrs shown by their meaning rather than
# their JSON type; the legend of docs/ops.md explains each name.
_NAMED_TYPES: tuple[tuple[Any, str], ...] = (
    (Axis, "axis"),
    (InsertAxis, "axis"),
    (Axes, "axes"),
    (Float, "float"),
    (DType, "dtype"),
    (Size, "size"),
)

_LEGEND = """\
| type | JSON value |
| --- | --- |
| `int`, `number`, `bool`, `string` | the JSON type of that name; `int >= 0` adds a bound |
| `float` | a number, or one of the strings `"nan"`, `"inf"`, `"-inf"` |
| `axis` | an axis of operand 0 (of the result, for ops that insert one); negative counts from the end |
| `axes` | an array of distinct axes of operand 0; negative counts from the end |
| `dtype` | a dtype name (`"float32"`, `"int32"`, `"bool"`, ...) |
| `size` | an axis size: an integer from 0 to 2147483647 (`2**31 - 1`) |
| `list[T]` | an array of `T` |
| `T \\| null` | `T`, or `null` |
| `"a" \\| "b"` | one of these strings |
| `{name: T, ...}` | an object with these fields |
"""


class AttrDoc(NamedTuple):
    """One attribute of an op, rendered for people: ``type`` is a JSON-level type
    name (see the legend of ``docs/ops.md``), ``default`` the default as JSON
    text, or None when the attribute is required."""

    name: str
    type: str
    default: str | None
    description: str


def builtin_ops() -> dict[str, OpSpec]:
    """The registered ops implemented inside mlxprog (not user-registered ones),
    sorted by family then name."""
    return {
        name: spec
        for name, spec in all_ops().items()
        if _defined_in(spec).startswith("mlxprog.")
    }


def _defined_in(spec: OpSpec) -> str:
    """The module that registered an op: its implementation's, or its host op's."""
    return (spec.impl if spec.host is None else type(spec.host)).__module__ or ""


def attr_docs(spec: OpSpec) -> list[AttrDoc]:
    """The attributes of an op, in declaration order."""
    described = attribute_docs(spec.attrs)
    return [
        AttrDoc(name, type_name(_field_type(field)), _default(field), described.get(name, ""))
        for name, field in spec.attrs.model_fields.items()
    ]


def describe_outputs(spec: OpSpec) -> str:
    """The result count in words: ``"1"``, ``"2"``, or ``"variable"`` when it
    depends on the attributes or the operand count."""
    return str(spec.outputs) if isinstance(spec.outputs, int) else "variable"


def type_name(tp: Any) -> str:
    """A short JSON-level name for an attribute type, e.g. ``axes | null``."""
    for named, name in _NAMED_TYPES:
        if tp == named:
            return name
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Annotated:
        return type_name(args[0]) + _bounds(args[1:])
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (list, tuple, set, frozenset, collections.abc.Sequence):
        items = [a for a in args if a is not Ellipsis]
        inner = " | ".join(dict.fromkeys(type_name(a) for a in items)) or "any"
        return f"list[{inner}]"
    if origin in (dict, collections.abc.Mapping):
        return f"{{string: {type_name(args[1]) if args else 'any'}}}"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        fields = ", ".join(
            f"{n}: {type_name(_field_type(f))}" for n, f in tp.model_fields.items()
        )
        return f"{{{fields}}}"
    return _SIMPLE.get(tp, getattr(tp, "__name__", str(tp)))


_SIMPLE = {int: "int", float: "number", bool: "bool", str: "string", type(None): "null",
           Any: "any"}


def _bounds(metadata: tuple) -> str:
    """Text for the numeric bounds in Annotated metadata: `` >= 0``, `` < 1`` or
    `` in [0, 1)``."""
    flat: list[Any] = []
    for item in metadata:
        flat.extend(item.metadata if isinstance(item, FieldInfo) else [item])
    lower = upper = None  # (interval bracket, comparison, value)
    for item in flat:
        if isinstance(item, annotated_types.Ge):
            lower = ("[", ">=", item.ge)
        elif isinstance(item, annotated_types.Gt):
            lower = ("(", ">", item.gt)
        elif isinstance(item, annotated_types.Le):
            upper = ("]", "<=", item.le)
        elif isinstance(item, annotated_types.Lt):
            upper = (")", "<", item.lt)
    if lower and upper:
        return f" in {lower[0]}{lower[2]}, {upper[2]}{upper[0]}"
    bound = lower or upper
    return f" {bound[1]} {bound[2]}" if bound else ""


def _field_type(field: FieldInfo) -> Any:
    """The field's annotation with the metadata pydantic split off put back."""
    if field.metadata:
        return Annotated[(field.annotation, *field.metadata)]
    return field.annotation


def _default(field: FieldInfo) -> str | None:
    if field.is_required():
        return None
    value = field.get_default(call_default_factory=True)
    return json.dumps(encode_nonfinite(to_jsonable_python(value)))


def render_op_reference(ops: Mapping[str, OpSpec] | None = None) -> str:
    """The Markdown op reference for ``ops`` (default: the built-in ops)."""
    ops = builtin_ops() if ops is None else ops
    families: dict[str, list[OpSpec]] = {}
    for spec in sorted(ops.values(), key=lambda s: (s.family, s.name)):
        families.setdefault(spec.family, []).append(spec)
    anchors = GithubAnchors()
    anchors("Op reference")
    anchors("Families")
    family_anchors, op_anchors = {}, {}
    for family, specs in families.items():
        family_anchors[family] = anchors(family)
        op_anchors.update((spec.name, anchors(spec.name)) for spec in specs)
    lines = [
        "# Op reference",
        "",
        f"<!-- Generated from the op registry by `{REGENERATE}`; do not edit. -->",
        "",
        f"{len(ops)} ops in {len(families)} families. The program format is described in "
        "[format.md](format.md). Attributes are named JSON fields; unknown attributes "
        "are rejected. Attribute types:",
        "",
        _LEGEND,
        "## Families",
        "",
    ]
    lines += [f"- [{family}](#{family_anchors[family]}) ({len(specs)})"
              for family, specs in families.items()]
    for family, specs in families.items():
        lines += ["", f"## {family}", ""]
        intro = _family_intro(specs[0])
        if intro:
            lines += [intro, ""]
        lines.append(", ".join(f"[`{s.name}`](#{op_anchors[s.name]})" for s in specs))
        for spec in specs:
            lines += ["", *_render_op(spec)]
    return "\n".join(lines) + "\n"


class GithubAnchors:
    """GitHub's heading anchors, given the headings in document order: the text
    lowercased, punctuation dropped, spaces as hyphens, ``-1``, ``-2``, ... on
    repeats."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    def __call__(self, heading: str) -> str:
        slug = "".join(c for c in heading.lower() if c.isalnum() or c in "-_ ")
        slug = slug.replace(" ", "-")
        count = self.seen[slug]
        self.seen[slug] += 1
        return f"{slug}-{count}" if count else slug


def _render_op(spec: OpSpec) -> list[str]:
    facts = [f"operands: {spec.describe_arity()}", f"results: {describe_outputs(spec)}"]
    if spec.subprograms:
        facts.append("subprograms: " + ", ".join(f"`{s}`" for s in spec.subprograms))
    if spec.host:
        facts.append("runs on the host (ends a compiled segment)")
    lines = [f"### `{spec.name}`", "", "*" + "; ".join(facts) + "*", ""]
    attrs = attr_docs(spec)
    if attrs:
        described = any(a.description for a in attrs)
        header = "| attribute | type | default |" + (" description |" if described else "")
        lines += [header, "| --- | --- | --- |" + (" --- |" if described else "")]
        for a in attrs:
            default = "required" if a.default is None else f"`{_cell(a.default)}`"
            row = f"| `{a.name}` | `{_cell(a.type)}` | {default} |"
            lines.append(row + (f" {_cell(a.description)} |" if described else ""))
        lines.append("")
    lines.append(spec.doc or "(undocumented)")
    return lines


def _family_intro(spec: OpSpec) -> str:
    """The first paragraph of the docstring of the module (or package) defining
    the family, when it is named after it."""
    name = _defined_in(spec)
    while name and name.rsplit(".", 1)[-1] != spec.family:
        name = name.rpartition(".")[0]
    module = sys.modules.get(name) if name else None
    return "" if module is None else (module.__doc__ or "").strip().split("\n\n", 1)[0]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
