"""The strict format: JSON the reader refuses (repeated keys, non-finite
literals, overflowing numbers, huge integers, deep nesting) and JSON types
the document models refuse instead of coercing. Each case is a FormatError,
never a RecursionError, ValueError or a silently changed value."""

from __future__ import annotations

import json
import math

import pytest

import mlxprog as mp
from mlxprog.format.json_reader import MAX_NESTING, read_json

H = '"format": "mlxprog", "version": 1'


def doc(**fields) -> dict:
    """A minimal valid document with ``fields`` replaced."""
    data = {"format": "mlxprog", "version": 1,
            "inputs": [{"name": "x", "shape": [2, 3], "dtype": "float32"}],
            "instructions": [{"op": "exp", "operands": [{"input": 0}]}],
            "outputs": [{"result": 0}]}
    data.update(fields)
    return data


def format_error(text: str | dict) -> str:
    """The message of the FormatError that loading ``text`` raises."""
    with pytest.raises(mp.FormatError) as info:
        mp.Program.loads(text if isinstance(text, str) else json.dumps(text))
    message = str(info.value)
    assert "recursion" not in message
    return message


def nested(depth: int, leaf="1") -> str:
    """A JSON array nested ``depth`` levels deep."""
    return "[" * depth + leaf + "]" * depth


# -- duplicate keys ------------------------------------------------------------------

@pytest.mark.parametrize("text, key", [
    ('{"op": "bogus", "op": "exp", "operands": [{"input": 0}]}', "op"),
    ('{"op": "exp", "operands": [{"input": 0, "input": 0}]}', "input"),
    ('{"op": "sum", "operands": [{"input": 0}], "attrs": {"axes": [0], "axes": [1]}}', "axes"),
    ('{"op": "exp", "operands": [{"input": 0}], "attrs": {"a": {"b": 1, "b": 2}}}', "b"),
])
def test_duplicate_keys_are_rejected_at_every_level(text, key):
    message = format_error("{" + H + ', "inputs": [{"name": "x", "shape": [2], "dtype": '
                           '"float32"}], "instructions": [' + text + '], "outputs": []}')
    assert message.startswith(f"duplicate key {key!r} in an object")


def test_duplicate_top_level_key_and_in_a_subprogram():
    assert "duplicate key 'version'" in format_error('{' + H + ', "version": 1}')
    sub = ('{"instructions": [], "outputs": [{"carry": 0}], "outputs": [{"carry": 0}]}')
    text = ('{' + H + ', "inputs": [{"name": "x", "shape": [], "dtype": "float32"}], '
            '"instructions": [{"op": "while", "operands": [{"input": 0}], "subprograms": '
            '{"cond": ' + sub + ', "body": ' + sub + '}}], "outputs": []}')
    assert format_error(text).startswith("duplicate key 'outputs'")


def test_equal_keys_in_different_objects_and_colons_in_strings_are_fine():
    prog = mp.Program.loads(json.dumps(doc(name='a: "b": [c]: {d}: \\"', inputs=[
        {"name": "x:y", "shape": [2], "dtype": "float32"},
        {"name": "z", "shape": [2], "dtype": "float32"}])))
    assert prog.name == 'a: "b": [c]: {d}: \\"'
    assert [spec.name for spec in prog.inputs] == ["x:y", "z"]


# -- numbers ---------------------------------------------------------------------------

@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_literals_are_rejected(literal):
    message = format_error('{' + H + ', "constants": [{"value": ' + literal
                           + ', "dtype": "float32"}]}')
    assert f"the JSON literal {literal} is not allowed" in message
    assert '"nan", "inf" and "-inf"' in message


@pytest.mark.parametrize("literal", ["1e400", "-1e400", "1" * 400 + ".0"])
def test_number_overflowing_float64_is_rejected_not_read_as_infinity(literal):
    message = format_error('{' + H + ', "constants": [{"value": ' + literal
                           + ', "dtype": "float32"}]}')
    assert "beyond the float64 range" in message


def test_non_finite_strings_are_the_spelling():
    prog = mp.Program.loads('{' + H + ', "constants": [{"value": ["nan", "inf", "-inf", 1e308],'
                            ' "dtype": "float64"}]}')
    (const,) = mp.validate(prog).constants
    assert [math.isnan(v) or v for v in const.tolist()] == [True, math.inf, -math.inf, 1e308]


def test_integer_literals_over_the_digit_limit_are_a_format_error():
    message = format_error('{' + H + ', "constants": [{"value": ' + "9" * 5000
                           + ', "dtype": "int64"}]}')
    assert message.startswith("not valid JSON: an integer literal has more than")


def test_from_dict_rejects_non_finite_floats():
    for value in (math.nan, math.inf, [1.0, -math.inf]):
        with pytest.raises(mp.FormatError, match='spells non-finite floats as the strings'):
            mp.Program.from_dict(doc(constants=[{"value": value, "dtype": "float32"}]))


# -- nesting -----------------------------------------------------------------------------

def nested_conds(depth: int) -> str:
    """A document whose instruction is a cond nested ``depth`` deep (built as
    text: ``json.dumps`` itself cannot write 1,000 levels)."""
    inst = '{"op": "exp", "operands": [{"input": 0}]}'
    for _ in range(depth):
        inst = ('{"op": "cond", "operands": [{"input": 1}, {"input": 0}], "subprograms": '
                '{"then": {"instructions": [' + inst + '], "outputs": [{"result": 0}]}, '
                '"else": {"instructions": [], "outputs": [{"carry": 0}]}}}')
    return ('{' + H + ', "inputs": [{"name": "x", "shape": [2], "dtype": "float32"}, '
            '{"name": "p", "shape": [], "dtype": "bool"}], "instructions": [' + inst + '], '
            '"outputs": [{"result": 0}]}')


@pytest.mark.parametrize("depth", [70, 250])
def test_deeply_nested_subprograms_are_a_format_error(depth):
    # 250 deep is over 1,000 levels of JSON: a RecursionError before.
    with pytest.raises(mp.FormatError, match=f"nested more than {MAX_NESTING} levels deep"):
        mp.Program.loads(nested_conds(depth))


@pytest.mark.parametrize("depth", [MAX_NESTING, 100_000])
def test_deep_json_is_a_format_error_however_deep(depth):
    text = '{' + H + ', "constants": [{"value": ' + nested(depth) + ', "dtype": "int32"}]}'
    message = format_error(text)
    assert message == f"arrays and objects are nested more than {MAX_NESTING} levels deep"


def test_nesting_up_to_the_limit_is_read():
    assert read_json(nested(MAX_NESTING)) is not None
    assert read_json('{"a": ' + nested(MAX_NESTING - 1) + "}")["a"] is not None
    with pytest.raises(mp.FormatError, match="nested more than"):
        read_json('{"a": ' + nested(MAX_NESTING) + "}")


@pytest.mark.parametrize("text", [
    '{"name": "' + "[" * 1000 + '"}',
    '{"name": "\\"' + "{" * 1000 + '\\\\"}',
    '{"name": "\\\\", "x": "' + "[" * 1000 + '"}',
    ('{"name": "' + "[" * 1000 + '"}').encode(),
    '{"name": "é[ü' + "[" * 1000 + '"}',
])
def test_brackets_inside_strings_do_not_nest(text):
    assert read_json(text)["name"]


def test_from_dict_checks_the_nesting_too():
    value: list = [1]
    for _ in range(10_000):
        value = [value]
    with pytest.raises(mp.FormatError, match="nested more than"):
        mp.Program.from_dict(doc(constants=[{"value": value, "dtype": "int32"}]))
    attrs = {"a": value}
    with pytest.raises(mp.FormatError, match="nested more than"):
        mp.Program.from_dict(doc(instructions=[{"op": "exp", "operands": [], "attrs": attrs}]))


def test_bytes_must_be_utf8():
    text = json.dumps(doc(name="naïve"))
    assert mp.Program.loads(text.encode()).name == "naïve"
    assert mp.Program.loads(b"\xef\xbb\xbf" + text.encode()).name == "naïve"
    with pytest.raises(mp.FormatError, match="not valid JSON: 'utf-8' codec"):
        mp.Program.loads(text.encode("utf-16"))


# -- strict JSON types -------------------------------------------------------------------

@pytest.mark.parametrize("fields, where", [
    ({"instructions": [{"op": "exp", "operands": [{"input": "0"}]}]},
     "instruction 0 > operand 0 > input"),
    ({"outputs": [{"result": True}]}, "output 0 > result"),
    ({"outputs": [{"result": 0.0}]}, "output 0 > result"),
    ({"inputs": [{"name": "x", "shape": [True], "dtype": "float32"}]}, "input 0 > shape > 0"),
    ({"inputs": [{"name": "x", "shape": [2.0], "dtype": "float32"}]}, "input 0 > shape > 0"),
    ({"inputs": [{"name": "x", "shape": [1e30], "dtype": "float32"}]}, "input 0 > shape > 0"),
    ({"inputs": [{"name": 7, "shape": [2], "dtype": "float32"}]}, "input 0 > name"),
    ({"dims": {"T": {"min": True}}}, "dims > T > min"),
    ({"dims": {"T": {"max": "1"}}}, "dims > T > max"),
    ({"name": 3}, "name"),
    ({"instructions": [{"op": "exp", "operands": [{"input": 0}], "attrs": None}]},
     "instruction 0 > attrs"),
])
def test_wrong_json_types_are_rejected_not_coerced(fields, where):
    assert format_error(doc(**fields)).startswith(where)


@pytest.mark.parametrize("shape", [[2**31], [2, 2**40]])
def test_sizes_beyond_mlx_int32_are_a_format_error(shape):
    message = format_error(doc(inputs=[{"name": "x", "shape": shape, "dtype": "float32"}]))
    assert message.startswith("input 0 > shape") and "2147483647" in message
    message = format_error(doc(captures=[{"name": "w", "shape": shape, "dtype": "float32"}]))
    assert message.startswith("capture 0 > shape")
    assert "2147483647" in format_error(doc(dims={"T": {"max": 2**31}}))


@pytest.mark.parametrize("spec, found", [
    ({"name": "w", "shape": ["1"], "dtype": "float32"}, "found '1'"),
    ({"name": "w", "shape": [2, "T"], "dtype": "float32"}, "found 'T'"),
    ({"name": "w", "shape": [], "dtype": "int32", "value_of": "T"}, "value_of is for inputs only"),
])
def test_captures_have_static_shapes(spec, found):
    message = format_error(doc(captures=[spec]))
    assert message.startswith("captures: capture 0 ('w'): ") and found in message


def test_from_dict_is_strict_too():
    with pytest.raises(mp.FormatError, match="input 0 > shape"):
        mp.Program.from_dict(doc(inputs=[{"name": "x", "shape": (2, 3), "dtype": "float32"}]))
    with pytest.raises(mp.FormatError, match="output 0 > result"):
        mp.Program.from_dict(doc(outputs=[{"result": "0"}]))
