"""The program model and its JSON form: refs, round trips, format/version checks,
and where a FormatError says the problem is."""

from __future__ import annotations

import gc
import json
import math

import pydantic
import pytest

import mlxprog as mp
from mlxprog.format.program import Constant, Instruction, Ref


def doc(**fields) -> dict:
    """A minimal valid document with ``fields`` replaced."""
    data = {"format": "mlxprog", "version": 1,
            "inputs": [{"name": "x", "shape": [2, 3], "dtype": "float32"}],
            "instructions": [{"op": "exp", "operands": [{"input": 0}]}],
            "outputs": [{"result": 0}]}
    data.update(fields)
    return data


def format_error(data) -> str:
    """The message of the FormatError that loading ``data`` (a dict or text) raises."""
    text = data if isinstance(data, str) else json.dumps(data)
    with pytest.raises(mp.FormatError) as info:
        mp.Program.loads(text)
    return str(info.value)


def strict_json(text: str):
    """Parse JSON, rejecting the non-standard NaN/Infinity literals."""
    def reject(name):
        raise AssertionError(f"non-standard JSON literal {name}")
    return json.loads(text, parse_constant=reject)


# -- refs ------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["input", "capture", "const", "result", "carry"])
def test_ref_kind_index_and_serialisation(kind):
    ref = Ref.of(kind, 3)
    assert (ref.kind, ref.index) == (kind, 3)
    assert ref.model_dump() == {kind: 3}
    assert str(ref) == f"{kind} 3"
    assert Ref.parse({kind: 3}) == ref


@pytest.mark.parametrize("data", [{}, {"input": 0, "result": 1}])
def test_ref_needs_exactly_one_key(data):
    with pytest.raises(pydantic.ValidationError, match="exactly one key"):
        Ref.parse(data)
    bad = doc(instructions=[{"op": "exp", "operands": [data]}])
    assert "instruction 0 > operand 0" in format_error(bad)


def test_ref_rejects_negative_index_and_unknown_kind():
    assert "instruction 0 > operand 0 > input" in format_error(
        doc(instructions=[{"op": "exp", "operands": [{"input": -1}]}]))
    message = format_error(doc(instructions=[{"op": "exp", "operands": [{"weight": 0}]}]))
    assert "instruction 0 > operand 0: a ref is an object with exactly one key (input" in message


def test_refs_are_written_as_single_key_objects():
    data = strict_json(mp.Program.from_dict(doc()).to_json())
    assert data["instructions"][0]["operands"] == [{"input": 0}]
    assert data["outputs"] == [{"result": 0}]


# -- round trips -----------------------------------------------------------------

def rich_program() -> mp.Program:
    return mp.Program.from_dict({
        "format": "mlxprog",
        "version": 1,
        "name": "rich",
        "inputs": [{"name": "x", "shape": [2, 3], "dtype": "float32"},
                   {"name": "n", "shape": [], "dtype": "int32"}],
        "captures": [{"name": "w", "shape": [3], "dtype": "bfloat16"}],
        "constants": [{"value": "nan", "dtype": "float32"},
                      {"value": [1.5, "inf", "-inf"], "dtype": "float32"},
                      {"value": [[1, 2], [3, 4]], "dtype": "int32"},
                      {"value": True, "dtype": "bool"}],
        "instructions": [
            {"op": "multiply", "operands": [{"input": 0}, {"capture": 0}]},
            {"op": "clip", "operands": [{"result": 0}, {"const": 1}, {"const": 0}],
             "attrs": {"eps": 1e-5, "lo": "-inf", "hi": "inf", "axes": [0, -1]}},
            {"op": "while", "operands": [{"result": 1}], "attrs": {"max_iterations": 10},
             "subprograms": {
                 "cond": {"instructions": [], "outputs": [{"const": 3}]},
                 "body": {"instructions": [{"op": "exp", "operands": [{"carry": 0}]}],
                          "outputs": [{"result": 0}]}}},
        ],
        "outputs": [{"result": 2}, {"input": 1}],
    })


def test_json_round_trip_is_exact():
    prog = rich_program()
    text = prog.to_json()
    assert mp.Program.loads(text) == prog
    assert mp.Program.loads(prog.to_json(indent=2)) == prog
    assert mp.Program.loads(text).to_json() == text


def test_to_json_is_standard_json_with_nonfinite_strings():
    data = strict_json(rich_program().to_json())
    assert list(data)[:2] == ["format", "version"]
    assert (data["format"], data["version"]) == ("mlxprog", 1)
    assert data["constants"][0]["value"] == "nan"
    assert data["constants"][1]["value"] == [1.5, "inf", "-inf"]
    attrs = data["instructions"][1]["attrs"]
    assert attrs == {"eps": 1e-5, "lo": "-inf", "hi": "inf", "axes": [0, -1]}


def test_python_nonfinite_floats_are_written_as_strings():
    prog = mp.Program(
        constants=[Constant(value=[math.nan, math.inf, -math.inf, 0.25], dtype="float32")],
        instructions=[Instruction(op="exp", operands=[Ref.of("const", 0)],
                                     attrs={"value": -math.inf})],
    )
    data = strict_json(prog.to_json())
    assert data["constants"][0]["value"] == ["nan", "inf", "-inf", 0.25]
    assert data["instructions"][0]["attrs"] == {"value": "-inf"}


def test_defaults_are_omitted_and_restored():
    prog = mp.Program()
    assert strict_json(prog.to_json()) == {"format": "mlxprog", "version": 1}
    assert mp.Program.loads(prog.to_json()) == prog


def test_save_and_load(tmp_path):
    prog = rich_program()
    path = tmp_path / "rich.json"
    prog.save(path)
    assert path.read_text().endswith("\n")
    assert mp.Program.load(path) == prog
    assert mp.Program.load(str(path)) == prog


def test_loads_accepts_bytes():
    assert mp.Program.loads(json.dumps(doc()).encode()) == mp.Program.from_dict(doc())


# -- format and version ------------------------------------------------------------

def test_newer_version_is_a_clear_error():
    message = format_error(doc(version=2))
    assert "version 2" in message and "version 1" in message and "upgrade" in message


@pytest.mark.parametrize("version", [0, -1])
def test_older_version_is_rejected(version):
    assert f"version {version}" in format_error(doc(version=version))


@pytest.mark.parametrize("version", ["1", 1.0, True, None])
def test_version_must_be_an_integer(version):
    assert '"version" must be an integer' in format_error(doc(version=version))


def test_missing_version_is_rejected():
    data = doc()
    del data["version"]
    assert '"version"' in format_error(data)


@pytest.mark.parametrize("tag", ["stablehlo", None])
def test_format_tag_is_checked(tag):
    data = doc(format=tag) if tag else {k: v for k, v in doc().items() if k != "format"}
    message = format_error(data)
    assert '"format" must be "mlxprog"' in message and repr(tag) in message


@pytest.mark.parametrize("text", ["", "{", '{"format": "mlxprog",}', "not json"])
def test_bad_json(text):
    assert format_error(text).startswith("not valid JSON")


@pytest.mark.parametrize("data", [b"\x89PNG\r\n\x1a\n", b"\xff\xfe\x00"])
def test_binary_data_is_not_valid_json(data):
    with pytest.raises(mp.FormatError, match="^not valid JSON: .*codec can't decode"):
        mp.Program.loads(data)


@pytest.mark.parametrize("enabled", [True, False])
def test_loading_restores_the_garbage_collector_state(enabled):
    good, bad = json.dumps(doc()), json.dumps(doc(outputs=[{"result": -1}]))
    try:
        if not enabled:
            gc.disable()
        mp.Program.loads(good)
        assert gc.isenabled() == enabled
        with pytest.raises(mp.FormatError):
            mp.Program.loads(bad)
        assert gc.isenabled() == enabled
    finally:
        gc.enable()


@pytest.mark.parametrize("value", [[], "program", 3])
def test_document_must_be_an_object(value):
    assert "a program is a JSON object" in format_error(json.dumps(value))


def test_unknown_top_level_key():
    message = format_error(doc(comment="written by hand"))
    assert message == "comment: Extra inputs are not permitted"


# -- locations in FormatError messages ---------------------------------------------

@pytest.mark.parametrize("fields, where", [
    ({"inputs": [{"name": "x", "shape": [2, -3], "dtype": "float32"}]}, "input 0 > shape > 1"),
    ({"inputs": [{"name": "x", "shape": [2], "dtype": "float33"}]}, "input 0 > dtype"),
    ({"captures": [{"name": "", "shape": [2], "dtype": "float32"}]}, "capture 0 > name"),
    ({"constants": [{"value": 1.0, "dtype": "f32"}]}, "constant 0 > dtype"),
    ({"constants": [{"value": {"a": 1}, "dtype": "float32"}]}, "constant 0 > value"),
    ({"instructions": [{"op": "exp", "operands": [{"input": 0}]}, {"operands": []}]},
     "instruction 1 > op"),
    ({"instructions": [{"op": "exp", "operands": [{"input": 0}, {"input": "a"}]}]},
     "instruction 0 > operand 1 > input"),
    ({"instructions": [{"op": "exp", "operands": "x"}]}, "instruction 0 > operands"),
    ({"instructions": [{"op": "exp", "attrs": [1]}]}, "instruction 0 > attrs"),
    ({"instructions": [{"op": "exp", "subprograms": {"body": {"outputs": [{"carry": -1}]}}}]},
     "instruction 0 > subprogram 'body' > output 0 > carry"),
    ({"instructions": [{"op": "exp", "subprograms": {"body": {"instructions": [{"op": 7}]}}}]},
     "instruction 0 > subprogram 'body' > instruction 0 > op"),
    ({"outputs": [{"result": 0}, {"result": -2}]}, "output 1 > result"),
])
def test_format_error_names_the_location(fields, where):
    assert format_error(doc(**fields)).startswith(where)


def test_unknown_dtype_message_lists_known_dtypes():
    message = format_error(doc(inputs=[{"name": "x", "shape": [2], "dtype": "float33"}]))
    assert "unknown dtype 'float33'" in message and "bfloat16" in message


@pytest.mark.parametrize("value, found", [
    ("nanx", "found 'nanx'"),
    ([[1, 2], [3, "x"]], "found 'x' at value[1][1]"),
    ([1.0, None], "found None at value[1]"),
])
def test_bad_constant_value_is_one_clear_message(value, found):
    message = format_error(doc(constants=[{"value": value, "dtype": "float32"}]))
    assert message == ('constant 0 > value: a constant is a number, a bool, "nan", "inf", '
                       f'"-inf" or a nested list of them; {found}')


def test_many_problems_are_summarised():
    message = format_error(doc(outputs=[{"result": -1}] * 8))
    assert message.count("Input should be greater than or equal to 0") == 5
    assert message.endswith("... and 3 more")


def test_load_names_the_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc(version=3)))
    with pytest.raises(mp.FormatError, match="bad.json: program has format version 3"):
        mp.Program.load(path)
    with pytest.raises(mp.FormatError, match="cannot read program file .*missing.json"):
        mp.Program.load(tmp_path / "missing.json")


def test_models_are_frozen():
    prog = mp.Program.from_dict(doc())
    with pytest.raises(pydantic.ValidationError):
        prog.name = "renamed"
