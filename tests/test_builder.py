"""ProgramBuilder: declarations, op methods, scalar operands, operator shorthands,
constant sharing, errors at the line that made them, and ``build``."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from mlxprog.format.program import Constant, Instruction, Ref
from helpers import assert_close


@pytest.fixture
def b() -> mp.ProgramBuilder:
    return mp.ProgramBuilder("test")


def test_declarations_and_values(b):
    x = b.input("x", (2, 3), "float32")
    w = b.capture("w", [3], "bfloat16")
    c = b.constant([[1, 2]], "int32")
    assert (str(x.ref), x.shape, x.dtype, x.ndim) == ("input 0", (2, 3), mx.float32, 2)
    assert (str(w.ref), w.shape, w.dtype) == ("capture 0", (3,), mx.bfloat16)
    assert (str(c.ref), c.shape, c.dtype) == ("const 0", (1, 2), mx.int32)
    assert repr(x) == "Value(input 0: float32[2, 3])"


def test_build_returns_the_program(b):
    x = b.input("x", (2, 3), "float32")
    y = b.op("exp", x)
    z = b.add(y, x)
    prog = b.build([z, y])
    assert prog.name == "test"
    assert [spec.name for spec in prog.inputs] == ["x"]
    assert [(i.op, [str(r) for r in i.operands]) for i in prog.instructions] == [
        ("exp", ["input 0"]), ("add", ["result 0", "input 0"])]
    assert [str(r) for r in prog.outputs] == ["result 1", "result 0"]
    assert b.build(z).outputs == [z.ref]  # a single Value is a one-output program


def test_build_round_trips_through_json_and_runs(b):
    x = b.input("x", (2, 3), "float32")
    w = b.capture("w", (2, 3), "float32")
    y = b.sigmoid(x * w - 0.5)
    prog = b.build([y])
    again = mp.Program.loads(prog.to_json())
    assert again == prog
    mp.validate(again)
    xs, ws = mx.arange(6, dtype=mx.float32).reshape(2, 3), mx.full((2, 3), 0.25)
    (out,) = mp.run(again, xs, captures={"w": ws})
    assert_close(out, mx.sigmoid(xs * ws - 0.5))


def test_a_method_per_registered_op(b):
    for name in mp.all_ops():
        method = getattr(b, name)
        assert callable(method) and method.__name__ == name
    x = b.input("x", (4,), "float32")
    y = b.exp(x)
    assert b.instructions[-1] == Instruction(op="exp", operands=[x.ref])
    (out,) = mp.run(b.build([y]), mx.array([0.0, 1.0, 2.0, 3.0]))
    assert_close(out, np.exp([0.0, 1.0, 2.0, 3.0]))


def test_attributes_are_keyword_arguments(b):
    x = b.input("x", (2, 3), "float32")
    y = b.astype(x, dtype="int32")
    s = b.sum(x, axes=[-1], keepdims=True)
    assert (y.dtype, s.shape) == (mx.int32, (2, 1))
    assert b.instructions[-1].attrs == {"axes": [-1], "keepdims": True}


def test_multi_output_ops_return_tuples(b):
    x = b.input("x", (2, 6), "float32")
    parts = b.split(x, indices_or_sections=3, axis=1)
    assert isinstance(parts, tuple) and len(parts) == 3
    assert [str(p.ref) for p in parts] == ["result 0", "result 1", "result 2"]
    assert all(p.shape == (2, 2) for p in parts)
    prog = b.build([parts[2], parts[0]])
    xs = mx.arange(12, dtype=mx.float32).reshape(2, 6)
    last, first = mp.run(prog, xs)
    assert_close(last, xs[:, 4:])
    assert_close(first, xs[:, :2])


# -- scalar operands ------------------------------------------------------------------

@pytest.mark.parametrize("dtype, scalar, const_dtype", [
    ("float32", 2, "float32"),
    ("float32", 0.5, "float32"),
    ("float16", 0.5, "float16"),
    ("bfloat16", 3, "bfloat16"),
    ("int32", 2, "int32"),
    ("uint8", 7, "uint8"),
    ("int32", 0.5, "float32"),
    ("float32", True, "bool"),
])
def test_python_scalars_become_constants_of_a_matching_dtype(b, dtype, scalar, const_dtype):
    x = b.input("x", (3,), dtype)
    b.multiply(x, scalar)
    assert b.constants == [Constant(value=scalar, dtype=const_dtype)]
    assert b.instructions[-1].operands == [x.ref, Ref.of("const", 0)]


def test_scalar_first_operand(b):
    x = b.input("x", (3,), "float16")
    y = b.subtract(1, x)
    assert b.instructions[-1].operands == [Ref.of("const", 0), x.ref]
    assert y.dtype == mx.float16
    (out,) = mp.run(b.build([y]), mx.array([1.0, 2.0, 3.0], dtype=mx.float16))
    assert_close(out, [0.0, -1.0, -2.0], dtype=mx.float16)


def test_scalars_without_an_array_operand(b):
    y = b.add(1, 2.5)
    assert b.constants == [Constant(value=1, dtype="int32"),
                           Constant(value=2.5, dtype="float32")]
    (out,) = mp.run(b.build([y]))
    assert out.item() == 3.5


# -- operator shorthands ----------------------------------------------------------------

def test_operator_shorthands(b):
    x = b.input("x", (2, 2), "float32")
    w = b.input("w", (2, 2), "float32")
    exprs = [x + w, x - w, x * w, x / w, x @ w, -x, 1 + x, 1 - x, 2 * x, 1 / x]
    assert [i.op for i in b.instructions] == [
        "add", "subtract", "multiply", "divide", "matmul", "negate",
        "add", "subtract", "multiply", "divide"]
    xs = mx.array([[1.0, 2.0], [3.0, 4.0]])
    ws = mx.array([[0.5, -1.0], [2.0, 1.0]])
    outs = mp.run(b.build(exprs), xs, ws)
    expected = [xs + ws, xs - ws, xs * ws, xs / ws, xs @ ws, -xs, 1 + xs, 1 - xs, 2 * xs, 1 / xs]
    for out, ref in zip(outs, expected):
        assert_close(out, ref)


# -- constants ----------------------------------------------------------------------------

def test_equal_constants_are_shared(b):
    x = b.input("x", (3,), "float32")
    first = b.constant(0.5)
    assert b.constant(0.5) is first
    b.add(x, 0.5)
    b.multiply(x, 0.5)
    assert b.constants == [Constant(value=0.5, dtype="float32")]
    assert b.constant(0.5, "float16") is not first
    assert b.constant([1, 2], "int32") is b.constant([1, 2], "int32")
    assert len(b.constants) == 3


def test_array_constant(b):
    c = b.constant(mx.array([[1.0, 2.0]]))
    assert c.shape == (1, 2)
    assert b.constants == [Constant(value=[[1.0, 2.0]], dtype="float32")]


def test_bad_constant_fails_at_the_call(b):
    with pytest.raises(mp.ValidationError, match="value out of range for uint8"):
        b.constant(300, "uint8")
    assert b.constants == []


# -- errors at the line that made them ---------------------------------------------------------

def test_bad_attrs_fail_at_the_call(b):
    x = b.input("x", (2, 3), "float32")
    b.exp(x)
    with pytest.raises(mp.ValidationError) as info:
        b.astype(x, dtype="float33")
    assert str(info.value).startswith("instruction 1 (astype): attribute 'dtype': unknown dtype")
    with pytest.raises(mp.ValidationError, match=r"instruction 1 \(sum\): attribute 'axes'"):
        b.sum(x, axes=[2])
    with pytest.raises(mp.ValidationError, match="attribute 'bogus': unknown attribute"):
        b.exp(x, bogus=1)
    assert len(b.instructions) == 1  # failed calls append nothing
    b.build([b.exp(x)])


def test_shape_mismatch_fails_at_the_call(b):
    x = b.input("x", (2, 3), "float32")
    y = b.input("y", (4,), "float32")
    with pytest.raises(mp.ValidationError) as info:
        x + y
    assert str(info.value).startswith("instruction 0 (add): ")
    assert "(operands: float32[2, 3], float32[4])" in str(info.value)


def test_unknown_op_suggests_close_matches(b):
    x = b.input("x", (2,), "float32")
    with pytest.raises(mp.ValidationError, match=r"unknown op 'expp' \(did you mean 'exp'"):
        b.op("expp", x)
    with pytest.raises(mp.ValidationError, match=r"unknown op 'sqrtt' \(did you mean 'sqrt'"):
        b.sqrtt(x)


def test_wrong_operand_count_or_type(b):
    x = b.input("x", (2,), "float32")
    with pytest.raises(mp.ValidationError, match=r"instruction 0 \(add\): expects 2 operand"):
        b.add(x)
    with pytest.raises(mp.ValidationError, match="operand 1 is a .*expected a Value"):
        b.add(x, mx.array([1.0, 2.0]))


@pytest.mark.parametrize("kind", ["input", "capture"])
def test_duplicate_names(b, kind):
    declare = getattr(b, kind)
    declare("a", (2,), "float32")
    declare("b", (2,), "float32")
    with pytest.raises(mp.ValidationError, match=f"{kind} 2: duplicate {kind} name 'a'"):
        declare("a", (3,), "float32")


def test_results_of_another_builder_are_rejected(b):
    other = mp.ProgramBuilder("other")
    foreign = other.exp(other.input("z", (2,), "float32"))
    x = b.input("x", (2,), "float32")
    with pytest.raises(mp.ValidationError, match=r"operand 1 \(result 0\) belongs to another"):
        b.add(x, foreign)
    with pytest.raises(mp.ValidationError, match=r"output 0 \(result 0\) belongs to another"):
        b.build([foreign])


def test_inputs_of_another_builder_are_rejected(b):
    # Bug: a foreign input Value is accepted and silently means this builder's input 0.
    other = mp.ProgramBuilder("other")
    z = other.input("z", (2,), "float32")
    x = b.input("x", (2,), "float32")
    with pytest.raises(mp.ValidationError, match="belongs to another"):
        b.add(x, z)


def test_build_rejects_non_values(b):
    x = b.input("x", (2,), "float32")
    with pytest.raises(mp.ValidationError, match="output 1 is not a Value"):
        b.build([x, 3])
