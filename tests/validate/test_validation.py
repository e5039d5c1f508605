"""One test per kind of validation error. Each checks that the message names the
instruction (index and subprogram path), the op, and what was expected vs found."""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest

import mlxprog as mp
from mlxprog.arrays import is_floating, name_of

X = {"input": 0}  # float32[2, 3]
Y = {"input": 1}  # float32[4]


def program(**fields) -> mp.Program:
    data = {"format": "mlxprog", "version": 1,
            "inputs": [{"name": "x", "shape": [2, 3], "dtype": "float32"},
                       {"name": "y", "shape": [4], "dtype": "float32"}]}
    data.update(fields)
    return mp.Program.from_dict(data)


def invalid(**fields) -> mp.ValidationError:
    """The ValidationError that validating the program with ``fields`` raises."""
    with pytest.raises(mp.ValidationError) as info:
        mp.validate(program(**fields))
    return info.value


def assert_names(err: mp.ValidationError, location: str, op: str | None, *details: str):
    assert (err.location, err.op) == (location, op)
    where = f"{location} ({op})" if op else location
    assert str(err).startswith(f"{where}: ")
    for detail in details:
        assert detail in err.detail


def two_instructions(second: dict) -> list[dict]:
    return [{"op": "exp", "operands": [X]}, second]


def test_valid_program_resolves_every_instruction():
    validated = mp.validate(program(
        instructions=two_instructions({"op": "add", "operands": [{"result": 0}, X]}),
        outputs=[{"result": 1}, Y]))
    assert [step.spec.name for step in validated.block.steps] == ["exp", "add"]
    assert [str(a) for a in validated.out_avals] == ["float32[2, 3]", "float32[4]"]


# -- ops, operands, attributes ---------------------------------------------------

def test_unknown_op_suggests_close_matches():
    err = invalid(instructions=two_instructions({"op": "expp", "operands": [X]}))
    assert_names(err, "instruction 1", "expp", "unknown op 'expp'", "did you mean 'exp'")


def test_unknown_op_without_close_match():
    err = invalid(instructions=[{"op": "frobnicate", "operands": [X]}])
    assert_names(err, "instruction 0", "frobnicate", "unknown op 'frobnicate'")
    assert "did you mean" not in err.detail


@pytest.mark.parametrize("op, operands, expected", [
    ("add", [X], "expects 2 operand(s), found 1"),
    ("exp", [X, X], "expects 1 operand(s), found 2"),
    ("select", [], "expects 3 operand(s), found 0"),
])
def test_wrong_operand_count(op, operands, expected):
    err = invalid(instructions=two_instructions({"op": op, "operands": operands}))
    assert_names(err, "instruction 1", op, expected)


def test_attrs_failing_the_model():
    err = invalid(instructions=[{"op": "astype", "operands": [X], "attrs": {}}])
    assert_names(err, "instruction 0", "astype", "attribute 'dtype': Field required")
    err = invalid(instructions=[{"op": "astype", "operands": [X], "attrs": {"dtype": 32}}])
    assert_names(err, "instruction 0", "astype", "attribute 'dtype'", "valid string")


def test_attr_axis_checked_against_operand_rank():
    err = invalid(instructions=[{"op": "sum", "operands": [Y], "attrs": {"axes": [1]}}])
    assert_names(err, "instruction 0", "sum", "attribute 'axes'",
                 "axis 1 is out of range for an operand of rank 1")


@pytest.mark.parametrize("op, attrs, known", [
    ("exp", {"foo": 1}, "known: none"),
    ("astype", {"dtype": "int32", "copy": True}, "known: dtype"),
])
def test_unknown_attr_keys(op, attrs, known):
    err = invalid(instructions=[{"op": op, "operands": [X], "attrs": attrs}])
    unknown = next(k for k in attrs if k != "dtype")
    assert_names(err, "instruction 0", op, f"attribute {unknown!r}: unknown attribute", known)


# -- refs -------------------------------------------------------------------------

@pytest.mark.parametrize("kind, index, count", [("input", 2, 2), ("capture", 0, 0),
                                                ("const", 1, 1)])
def test_ref_out_of_range(kind, index, count):
    err = invalid(constants=[{"value": 1.0, "dtype": "float32"}],
                  instructions=two_instructions({"op": "add", "operands": [X, {kind: index}]}))
    assert_names(err, "instruction 1", "add",
                 f"operand 1 refers to {kind} {index}, but there are only {count} {kind}(s)")


@pytest.mark.parametrize("index, produced", [(1, 1), (5, 1)])
def test_forward_ref(index, produced):
    err = invalid(instructions=two_instructions({"op": "exp", "operands": [{"result": index}]}))
    assert_names(err, "instruction 1", "exp",
                 f"operand 0 refers to result {index}, but only {produced} result(s) exist",
                 "already produced")


def test_carry_ref_at_top_level():
    err = invalid(instructions=[{"op": "exp", "operands": [{"carry": 0}]}])
    assert_names(err, "instruction 0", "exp",
                 "operand 0 is a carry ref", "only inside subprograms")
    err = invalid(outputs=[{"carry": 0}])
    assert_names(err, "outputs", None, "output 0 is a carry ref")


@pytest.mark.parametrize("ref, detail", [
    ({"result": 1}, "output 1 refers to result 1, but only 1 result(s) exist"),
    ({"input": 7}, "output 1 refers to input 7, but there are only 2 input(s)"),
])
def test_outputs_that_point_nowhere(ref, detail):
    err = invalid(instructions=[{"op": "exp", "operands": [X]}],
                  outputs=[{"result": 0}, ref])
    assert_names(err, "outputs", None, detail)


# -- subprograms --------------------------------------------------------------------

def while_program(body: list[dict]) -> dict:
    return dict(
        constants=[{"value": True, "dtype": "bool"}],
        instructions=[{"op": "while", "operands": [Y], "attrs": {"max_iterations": 3},
                       "subprograms": {"cond": {"outputs": [{"const": 0}]},
                                       "body": {"instructions": body,
                                                "outputs": [{"result": 0}]}}}],
        outputs=[{"result": 0}])


def test_error_inside_subprogram_names_the_path():
    err = invalid(**while_program([{"op": "exp", "operands": [{"carry": 0}]},
                                   {"op": "expp", "operands": [{"result": 0}]}]))
    assert_names(err, "instruction 0 > body > instruction 1", "expp", "did you mean 'exp'")


@pytest.mark.parametrize("ref, detail", [
    ({"carry": 1}, "operand 0 refers to carry 1, but there are only 1 carry(s)"),
    ({"result": 0}, "operand 0 refers to result 0, but only 0 result(s) exist"),
])
def test_bad_ref_inside_subprogram(ref, detail):
    err = invalid(**while_program([{"op": "exp", "operands": [ref]}]))
    assert_names(err, "instruction 0 > body > instruction 0", "exp", detail)


# -- declarations ------------------------------------------------------------------

@pytest.mark.parametrize("field, where", [("inputs", "input 0"), ("captures", "capture 0"),
                                          ("constants", "constant 0")])
def test_unknown_dtype_name_in_a_declaration(field, where):
    spec = ({"value": 1, "dtype": "float31"} if field == "constants"
            else {"name": "a", "shape": [2], "dtype": "float31"})
    with pytest.raises(mp.FormatError) as info:
        program(**{field: [spec]})
    assert str(info.value).startswith(f"{where} > dtype: unknown dtype 'float31'; known: bool")


def test_unknown_dtype_name_in_an_attr():
    err = invalid(instructions=[{"op": "astype", "operands": [X], "attrs": {"dtype": "f32"}}])
    assert_names(err, "instruction 0", "astype",
                 "attribute 'dtype': unknown dtype 'f32'", "known: bool")


@pytest.mark.parametrize("field, kind", [("inputs", "input"), ("captures", "capture")])
def test_duplicate_names(field, kind):
    specs = [{"name": n, "shape": [1], "dtype": "float32"} for n in ("a", "b", "a")]
    err = invalid(**{field: specs})
    assert_names(err, f"{kind} 2", None, f"duplicate {kind} name 'a'")


# -- shapes ------------------------------------------------------------------------

def test_static_shape_error():
    err = invalid(instructions=two_instructions({"op": "add", "operands": [{"result": 0}, Y]}))
    assert_names(err, "instruction 1", "add", "cannot be broadcast",
                 "(operands: float32[2, 3], float32[4])")


def test_shapes_are_inferred_through_the_program():
    validated = mp.validate(program(instructions=[
        {"op": "sum", "operands": [X], "attrs": {"axes": [-1]}},
        {"op": "astype", "operands": [{"result": 0}], "attrs": {"dtype": "int32"}},
        {"op": "less", "operands": [{"result": 1}, {"result": 1}]},
    ], outputs=[{"result": 2}]))
    results = validated.block.avals[validated.block.n_prefix:]
    assert [str(a) for a in results] == ["float32[2]", "int32[2]", "bool[2]"]
    assert [str(a) for a in validated.out_avals] == ["bool[2]"]
    assert validated.block.steps[0].attrs.axes == (1,)


# -- constants ---------------------------------------------------------------------

@pytest.mark.parametrize("value, dtype, detail", [
    ([[1, 2], [3]], "float32", "value is a ragged nested list"),
    ([[1, 2], 3], "int32", "value is a ragged nested list"),
    (1.5, "int32", "non-integer value for dtype int32"),
    ([1, "nan"], "int64", "non-integer value for dtype int64"),
    ("inf", "uint8", "non-integer value for dtype uint8"),
    (300, "uint8", "value out of range for uint8 [0, 255]"),
    (-1, "uint32", "value out of range for uint32 [0, 4294967295]"),
    ([0, 128], "int8", "value out of range for int8 [-128, 127]"),
    (2**63, "int64", "value out of range for int64"),
    (2**64, "uint64", "value out of range for uint64"),
    (1e5, "float16", "value out of range for float16"),
    (100000, "float16", "value out of range for float16"),
    (1e39, "float32", "value out of range for float32"),
    (1e39, "bfloat16", "value out of range for bfloat16"),
    ([2**63, -1], "uint64", "value out of range for uint64"),
    ([2**63, -1], "int64", "value out of range for int64"),
    ([2**64, 1.0], "uint64", "value out of range for uint64"),
    ([2**63 + 1, 0.5], "uint64", "non-integer value for dtype uint64: 0.5"),
    ([1.0, 2.5], "int32", "non-integer value for dtype int32: 2.5"),
    (2, "bool", "value out of range for bool [0, 1]"),
])
def test_bad_constant(value, dtype, detail):
    err = invalid(constants=[{"value": 0, "dtype": "int32"}, {"value": value, "dtype": dtype}])
    assert_names(err, "constant 1", None, detail)


@pytest.mark.parametrize("value, dtype, expected", [
    (2.0, "int32", 2),
    (2**64 - 1, "uint64", 2**64 - 1),
    ([1, "nan", "-inf"], "float16", [1.0, math.nan, -math.inf]),
    ("inf", "bfloat16", math.inf),
    (2**100, "float64", 2.0**100),
    ([], "int8", []),
    # Beyond int64 numpy infers float64 for these lists; they must stay exact.
    ([2**64 - 1, 7], "uint64", [2**64 - 1, 7]),
    ([2**63 + 5, 1.0], "uint64", [2**63 + 5, 1]),
    ([[2**53 + 1], [0.0]], "int64", [[2**53 + 1], [0]]),
    ([-2**63, 2**63 - 1], "int64", [-2**63, 2**63 - 1]),
    ([True, 1, 0.0], "bool", [True, True, False]),
])
def test_edge_constants_are_accepted(value, dtype, expected):
    (const,) = mp.validate(program(constants=[{"value": value, "dtype": dtype}])).constants
    assert name_of(const.dtype) == dtype
    np.testing.assert_array_equal(const.tolist(), expected)
    if not is_floating(const.dtype):  # numpy's comparison would round large integers
        assert const.tolist() == expected


def test_large_uint64_list_inputs_convert_exactly():
    prog = mp.Program.from_dict({
        "format": "mlxprog", "version": 1,
        "inputs": [{"name": "x", "shape": [2], "dtype": "uint64"}], "outputs": [X]})
    (out,) = mp.run(prog, [2**64 - 1, 7])
    assert out.tolist() == [2**64 - 1, 7]
    with pytest.raises(mp.BindingError, match="input 'x': value out of range for uint64"):
        mp.run(prog, [2**64, 7])


# -- before any trace ----------------------------------------------------------------

def test_validation_restores_the_garbage_collector_state():
    bad = program(instructions=two_instructions({"op": "expp", "operands": [X]}))
    with pytest.raises(mp.ValidationError):
        mp.validate(bad)
    assert gc.isenabled()


def test_compile_validates_first():
    bad = program(instructions=two_instructions({"op": "add", "operands": [{"result": 0}, Y]}))
    with pytest.raises(mp.ValidationError, match="instruction 1 \\(add\\)"):
        mp.compile(bad)



@pytest.mark.parametrize("op, attrs, detail", [
    ("sum", {"axes": ["1"]}, "attribute 'axes.0': Input should be a valid integer"),
    ("sum", {"axes": [True]}, "attribute 'axes.0': Input should be a valid integer"),
    ("sum", {"keepdims": "yes"}, "attribute 'keepdims': Input should be a valid boolean"),
    ("sum", {"keepdims": 1}, "attribute 'keepdims': Input should be a valid boolean"),
    ("random_key", {"seed": True}, "attribute 'seed': Input should be a valid integer"),
    ("full", {"shape": [True], "value": 0, "dtype": "float32"},
     "attribute 'shape.0': Input should be a valid integer"),
])
def test_attribute_json_types_are_strict(op, attrs, detail):
    operands = [] if op in ("random_key", "full") else [X]
    err = invalid(instructions=[{"op": op, "operands": operands, "attrs": attrs}])
    assert_names(err, "instruction 0", op, detail)


def test_arrays_fill_tuple_attributes_and_tuples_fill_list_attributes():
    # JSON has only arrays (pad_width is a list of pairs, random_normal's shape
    # a tuple); Python callers may pass tuples where the model has lists.
    mp.validate(program(instructions=[
        {"op": "pad", "operands": [X, {"const": 0}], "attrs": {"pad_width": [[1, 1], [0, 2]]}},
        {"op": "random_key", "attrs": {"seed": 3}},
        {"op": "random_normal", "operands": [{"result": 1}], "attrs": {"shape": [2, 3]}},
    ], constants=[{"value": 0.0, "dtype": "float32"}]))
    b = mp.ProgramBuilder("tuples")
    b.build([b.op("sum", b.input("x", [2, 3]), axes=(0, 1))])
