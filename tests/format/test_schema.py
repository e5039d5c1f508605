"""The full JSON Schema: a valid draft 2020-12 schema that accepts every example
and checks per-op attributes, operand counts and subprograms."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest

import mlxprog as mp
from mlxprog.ops.attrs import Axes, Float
from mlxprog.format.schema import DIALECT, full_schema

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.json"))


@pytest.fixture(scope="module")
def validator():
    schema = full_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors(validator, document) -> list[str]:
    """Schema error messages, each prefixed with its JSON path."""
    return [
        "/".join(map(str, e.absolute_path)) + ": " + e.message
        for e in validator.iter_errors(document)
    ]


BASE = {
    "format": "mlxprog",
    "version": 1,
    "inputs": [{"name": "x", "shape": [2, 3], "dtype": "float32"}],
    "instructions": [{"op": "exp", "operands": [{"input": 0}]}],
    "outputs": [{"result": 0}],
}


def with_instruction(instruction: dict) -> dict:
    doc = copy.deepcopy(BASE)
    doc["instructions"] = [instruction]
    return doc


def test_schema_is_draft_2020_12_and_plain_json():
    schema = full_schema()
    assert schema["$schema"] == DIALECT
    # Serialisable as strict JSON (non-finite defaults are written as strings).
    json.loads(json.dumps(schema, allow_nan=False))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_match_schema(validator, path):
    assert errors(validator, json.loads(path.read_text())) == []


def test_every_registered_op_has_a_condition():
    conditions = full_schema()["$defs"]["Instruction"]["allOf"]
    names = [c["if"]["properties"]["op"]["const"] for c in conditions]
    assert sorted(names) == sorted(mp.all_ops())


def test_base_document_is_valid(validator):
    assert errors(validator, BASE) == []


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda d: d.pop("format"), "'format' is a required property"),
        (lambda d: d.update(version=2), "1 was expected"),
        (lambda d: d.update(extra=1), "Additional properties"),
        (lambda d: d["outputs"].append({"result": 0, "input": 0}), "too many properties"),
        (lambda d: d["outputs"].append({}), "should be non-empty"),
        (lambda d: d["outputs"].append({"result": -1}), "less than the minimum"),
        (lambda d: d["inputs"][0].update(dtype="float33"), "is not one of"),
        (lambda d: d["instructions"][0].update(attrs={"axis": 1}), "'axis' was unexpected"),
        (lambda d: d["instructions"][0]["operands"].append({"input": 0}), "is too long"),
        (lambda d: d["instructions"][0].update(operands=[]), "should be non-empty"),
        (lambda d: d["instructions"][0].update(
            subprograms={"body": {"instructions": [], "outputs": []}}), "expected to be empty"),
    ],
)
def test_schema_rejects(validator, change, expected):
    doc = copy.deepcopy(BASE)
    change(doc)
    found = errors(validator, doc)
    assert any(expected in e for e in found), found


def test_attrs_are_typed_per_op(validator):
    good = with_instruction({"op": "astype", "operands": [{"input": 0}],
                             "attrs": {"dtype": "int32"}})
    assert errors(validator, good) == []
    bad = with_instruction({"op": "astype", "operands": [{"input": 0}],
                            "attrs": {"dtype": "int33"}})
    assert any("instructions/0/attrs/dtype" in e for e in errors(validator, bad))
    absent = with_instruction({"op": "astype", "operands": [{"input": 0}]})
    assert any("'attrs' is a required property" in e for e in errors(validator, absent))
    empty = with_instruction({"op": "astype", "operands": [{"input": 0}], "attrs": {}})
    assert any("'dtype' is a required property" in e for e in errors(validator, empty))


def test_subprograms_are_checked_and_validated_recursively(validator):
    loop = {
        "op": "while", "operands": [{"input": 0}],
        "subprograms": {
            "cond": {"instructions": [], "outputs": [{"carry": 0}]},
            "body": {"instructions": [{"op": "exp", "operands": [{"carry": 0}],
                                       "attrs": {"bogus": 1}}],
                     "outputs": [{"result": 0}]},
        },
    }
    found = errors(validator, with_instruction(loop))
    assert found and all("subprograms/body/instructions/0/attrs" in e for e in found), found
    del loop["subprograms"]["body"]["instructions"][0]["attrs"]
    assert errors(validator, with_instruction(loop)) == []
    del loop["subprograms"]["cond"]
    assert any("'cond' is a required property" in e
               for e in errors(validator, with_instruction(loop)))


def test_unknown_ops_are_allowed(validator):
    doc = with_instruction({"op": "my_custom_op", "operands": [{"input": 0}],
                            "attrs": {"anything": [1, "two"]}})
    assert errors(validator, doc) == []


class _UserAttrs(mp.Attrs):
    eps: Float = float("inf")
    axes: Axes | None = None


@pytest.fixture
def user_op():
    @mp.register_op("test_schema_user_op", attrs=_UserAttrs)
    def impl(operands, attrs):
        """A user op."""
        return operands[0]

    yield "test_schema_user_op"
    mp.unregister_op("test_schema_user_op")


def test_user_ops_join_the_schema(user_op):
    schema = full_schema()
    json.dumps(schema, allow_nan=False)  # the inf default is written as "inf"
    validator = jsonschema.Draft202012Validator(schema)
    for eps in (1e-5, "nan", "-inf"):
        doc = with_instruction({"op": user_op, "operands": [{"input": 0}],
                                "attrs": {"eps": eps, "axes": [-1]}})
        assert errors(validator, doc) == []
    doc = with_instruction({"op": user_op, "operands": [{"input": 0}],
                            "attrs": {"eps": "tiny"}})
    assert any("attrs/eps" in e for e in errors(validator, doc))


def test_schema_for_chosen_ops():
    schema = full_schema({"exp": mp.lookup("exp")})
    conditions = schema["$defs"]["Instruction"]["allOf"]
    assert [c["if"]["properties"]["op"]["const"] for c in conditions] == ["exp"]
