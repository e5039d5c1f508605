"""The full JSON Schema of format v1, with the attributes of every registered op.

:meth:`Program.json_schema` describes the document structure only: an
instruction's ``attrs`` is any object there. :func:`full_schema` adds, for each
registered op, a conditional on the instruction (``if`` its ``op`` is that name
``then`` its ``attrs`` match the op's attribute model, its operand count fits
and it has exactly the op's subprograms), so an emitter in any language can
check what it writes with an off-the-shelf JSON Schema validator.

Op names that are not registered pass the schema: users register their own ops
in Python, and a program using them is still a well-formed document.
``mlxprog validate`` (or :func:`mlxprog.validate`) rejects unknown ops, checks
refs and infers shapes, which no schema can express.
"""

from __future__ import annotations

from typing import Any, Mapping

from pydantic.json_schema import models_json_schema

from .program import Instruction, Program, encode_nonfinite
from ..ops.attrs import attribute_docs
from ..ops.registry import OpSpec, all_ops

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def full_schema(ops: Mapping[str, OpSpec] | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a program whose instructions use ``ops``
    (default: every registered op). ``mlxprog schema`` prints it."""
    ops = all_ops() if ops is None else ops
    attr_models = list(dict.fromkeys(spec.attrs for spec in ops.values()))
    models = [Program, Instruction, *attr_models]
    refs, schema = models_json_schema(
        [(m, "validation") for m in models], ref_template="#/$defs/{model}"
    )
    defs = schema["$defs"]

    def name_of(model: type) -> str:
        return refs[(model, "validation")]["$ref"].rsplit("/", 1)[-1]

    for model in attr_models:
        properties = defs[name_of(model)].get("properties", {})
        for field, description in attribute_docs(model).items():
            listed = properties.get(model.model_fields[field].alias or field)
            if listed is not None:
                listed.setdefault("description", description)
    root = defs.pop(name_of(Program))
    root["required"] = ["format", "version"]
    root["description"] = (
        "A program of mlxprog format v1 (see docs/format.md). Instructions whose op "
        "is registered in the mlxprog that generated this schema are checked against "
        "that op's attributes, operand count and subprograms; other op names are "
        "allowed (users register ops) and checked only by mlxprog itself."
    )
    defs[name_of(Instruction)]["allOf"] = [
        _op_condition(spec, f"#/$defs/{name_of(spec.attrs)}") for spec in ops.values()
    ]
    return encode_nonfinite({"$schema": DIALECT, **root, "$defs": defs})


def _op_condition(spec: OpSpec, attrs_ref: str) -> dict[str, Any]:
    """``if op == spec.name then`` its attrs, operand count and subprograms fit."""
    lo, hi = spec.operand_range()
    operands: dict[str, Any] = {"minItems": lo}
    if hi is not None:
        operands["maxItems"] = hi
    if spec.subprograms:
        names = list(spec.subprograms)
        subprograms = {"required": names, "propertyNames": {"enum": names}}
    else:
        subprograms = {"maxProperties": 0}
    then: dict[str, Any] = {
        "properties": {
            "attrs": {"$ref": attrs_ref},
            "operands": operands,
            "subprograms": subprograms,
        }
    }
    # Absent fields default to empty, which "properties" alone would let through.
    required = [] if lo == 0 else ["operands"]
    if any(field.is_required() for field in spec.attrs.model_fields.values()):
        required.append("attrs")
    if required:
        then["required"] = required
    return {"if": {"properties": {"op": {"const": spec.name}}, "required": ["op"]}, "then": then}
