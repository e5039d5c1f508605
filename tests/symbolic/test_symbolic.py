"""Symbolic dims: expressions, binding guards, trace cache, shapeless segments,
bucketing and the eager fallback."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import mlxprog as mp
from mlxprog.format.program import DimSpec
from mlxprog.symbolic import binding as dim_binding
from mlxprog.symbolic.binding import bind_dims
from mlxprog.symbolic.expr import evaluate, fmt, parse
from mlxprog.validate import SymbolicProgram


def program(instructions, outputs, inputs=None, dims=None, captures=None, constants=None):
    return mp.Program.from_dict({
        "format": "mlxprog", "version": 1, "name": "sym",
        "dims": {"T": {"min": 1, "max": 64}} if dims is None else dims,
        "inputs": inputs or [{"name": "x", "shape": ["T", 4], "dtype": "float32"}],
        "captures": captures or [], "constants": constants or [],
        "instructions": instructions, "outputs": outputs,
    })


# -- expressions and binding ---------------------------------------------------

def test_expressions_parse_and_simplify():
    assert fmt(parse("B*T + T - T")) == "B*T"
    assert fmt(parse("(T+1)*2 - 2")) == "2*T"
    assert fmt(parse("(2*T)//2")) == "T"
    assert evaluate(parse("T//2 + T%3"), {"T": 8}) == 6
    for bad in ["T**2", "f(T)", "T.x", "1.5*T", ""]:
        with pytest.raises(ValueError, match="not a dim expression"):
            parse(bad)


def test_binding_solves_linear_entries_and_reports_conflicts():
    specs = {"B": DimSpec(), "T": DimSpec(max=100)}
    got = bind_dims([("x", ["B", parse("2*T")], (3, 8)), ("y", [parse("T+1")], (5,))], specs)
    assert got == {"B": 3, "T": 4}
    cases = [
        ([("x", ["T"], (5,)), ("y", ["T"], (6,))],
         "input 'y' axis 0: dim T is 6 here, but input 'x' axis 0 bound it to 5"),
        ([("x", ["T"], (500,))], r"input 'x' axis 0: dim T=500 is outside its bounds \[1, 100\]"),
        ([("x", [parse("2*T")], (5,))], "5 is not a multiple of 2"),
        ([("x", [parse("B*T")], (6,))], "more than one unknown dim"),
        ([("x", ["T", 3], (2, 4))], "input 'x' axis 1: expected 3, got 4"),
        ([("x", ["T"], (2, 4))], "input 'x' expects rank 1"),
    ]
    for shapes, message in cases:
        with pytest.raises(mp.BindingError, match=message):
            bind_dims(shapes, specs)


# -- validation ------------------------------------------------------------------

def test_unknown_dims_are_validation_errors_naming_the_place():
    with pytest.raises(mp.ValidationError, match=r"input 'x' axis 0: unknown dim 'S'"):
        mp.validate(program([], [{"input": 0}],
                            inputs=[{"name": "x", "shape": ["S"], "dtype": "float32"}]))
    bad_attr = [{"op": "reshape", "operands": [{"input": 0}], "attrs": {"shape": ["N*4"]}}]
    with pytest.raises(mp.ValidationError, match=r"instruction 0 \(reshape\).*unknown dim 'N'"):
        mp.validate(program(bad_attr, [{"result": 0}]))
    with pytest.raises(mp.ValidationError, match="dims \\['U'\\] are declared but no input"):
        mp.validate(program([], [{"input": 0}], dims={"T": {}, "U": {}}))
    with pytest.raises(mp.FormatError, match=r"capture 0 \('w'\): captures have static shapes"):
        program([], [{"input": 0}], captures=[{"name": "w", "shape": ["T"], "dtype": "float32"}])


def test_program_that_can_never_be_shape_correct_fails_at_validation():
    # [T, 4] + [T+1, 4] cannot broadcast for any T >= 1... except none.
    prog = program(
        [{"op": "add", "operands": [{"input": 0}, {"input": 1}]}], [{"result": 0}],
        inputs=[{"name": "x", "shape": ["T", 4], "dtype": "float32"},
                {"name": "y", "shape": ["T+1", 4], "dtype": "float32"}],
        dims={"T": {"min": 2, "max": 64}},
    )
    with pytest.raises(mp.ValidationError, match=r"instruction 0 \(add\).*fails for every dim"):
        mp.validate(prog)


def test_program_correct_for_some_lengths_is_accepted_and_fails_clearly_for_others():
    halves = program([{"op": "reshape", "operands": [{"input": 0}],
                       "attrs": {"shape": ["T//2", 2]}}], [{"result": 0}],
                     inputs=[{"name": "x", "shape": ["T"], "dtype": "float32"}])
    exe = mp.compile(halves)
    assert exe(np.arange(6, dtype=np.float32))[0].shape == (3, 2)
    with pytest.raises(mp.ValidationError, match=r"instruction 0 \(reshape\).*with dims T=5"):
        exe(np.arange(5, dtype=np.float32))


def test_value_of_inputs_are_checked():
    base = [{"name": "x", "shape": ["T"], "dtype": "float32"}]
    with pytest.raises(mp.ValidationError, match="value_of names unknown dim 'S'"):
        mp.validate(program([], [{"input": 0}], inputs=base + [
            {"name": "n", "shape": [], "dtype": "int32", "value_of": "S"}]))
    with pytest.raises(mp.ValidationError, match="integer scalar"):
        mp.validate(program([], [{"input": 0}], inputs=base + [
            {"name": "n", "shape": [], "dtype": "float32", "value_of": "T"}]))


@pytest.mark.parametrize("text", ["T//0", "T%0", "T//(T-T)", "2*T%(3-3)"])
def test_division_by_a_zero_expression_is_refused_when_parsed(text):
    with pytest.raises(ValueError, match="divides by zero"):
        parse(text)


@pytest.mark.parametrize("entry", ["T//0", "T%0"])
def test_division_by_zero_is_a_validation_error_naming_the_place(entry):
    with pytest.raises(mp.ValidationError, match=r"^input 'x' axis 1: .*divides by zero"):
        mp.validate(program([], [{"input": 0}],
                            inputs=[{"name": "x", "shape": ["T", entry], "dtype": "float32"}]))
    attr = [{"op": "reshape", "operands": [{"input": 0}], "attrs": {"shape": [entry, 4]}}]
    with pytest.raises(mp.ValidationError,
                       match=r"^instruction 0 \(reshape\): attribute 'shape': .*divides by zero"):
        mp.validate(program(attr, [{"result": 0}]))


def test_a_divisor_zero_for_some_values_fails_there_with_the_place():
    # T-1 is 0 only at T=1: accepted, and a call binding T=1 names the input.
    exe = mp.compile(program([], [{"input": 0}], inputs=[
        {"name": "x", "shape": ["T", "4//(T-1)"], "dtype": "float32"}]))
    assert exe(np.zeros((3, 2), np.float32))[0].shape == (3, 2)
    with pytest.raises(mp.BindingError, match=r"input 'x' axis 1: division by zero in "
                                              r"\(4//\(T-1\)\) \(the divisor T-1 is 0 with T=1\)"):
        exe(np.zeros((1, 5), np.float32))
    # In an attribute, specialising for T=1 names the instruction.
    filled = program([{"op": "full", "attrs": {"shape": ["12//(T-1)"], "value": 1,
                                               "dtype": "int32"}}], [{"result": 0}])
    exe = mp.compile(filled)
    assert exe(np.zeros((4, 4), np.float32))[0].shape == (4,)
    with pytest.raises(mp.ValidationError, match=r"instruction 0 \(full\): attribute 'shape': "
                                                 r"division by zero.*with dims T=1"):
        exe(np.zeros((1, 4), np.float32))


@pytest.mark.parametrize("terms", [130, 1000, 100_000])
def test_long_expressions_are_refused_without_recursion_errors(terms):
    entry = "+".join(["T"] * terms)
    with pytest.raises(ValueError, match=f"has {len(entry)} characters; the most is 256"):
        parse(entry)
    with pytest.raises(mp.ValidationError, match="^input 'x' axis 0: dim expression"):
        mp.validate(program([], [{"input": 0}],
                            inputs=[{"name": "x", "shape": [entry], "dtype": "float32"}]))


def test_expressions_up_to_the_limit_work_and_print():
    entry = "+".join(["T"] * 128)  # 255 characters, nested 127 deep
    assert evaluate(parse(entry), {"T": 2}) == 256 and fmt(parse(entry)) == "128*T"
    assert evaluate(parse("-" * 255 + "T"), {"T": 3}) == -3
    # Products of sums of distinct dims are printed as written, not expanded.
    product = "*".join(f"({a}+{b})" for a, b in zip("ACEGIKMOQSUW", "BDFHJLNPRTVX"))
    assert fmt(parse(product)).count("+") < 200


def test_operations_print_with_their_operands_parenthesised():
    assert fmt(parse("T%(T-1)")) == "(T%(T-1))"
    assert fmt(parse("(T-1)//2*2")) == "(((T-1)//2)*2)"
    assert fmt(parse("T//2 + T%3")) == "((T//2)+(T%3))"


@pytest.mark.parametrize("entry", ["-T", "T-8"])
def test_input_shapes_that_evaluate_negative_are_validation_errors(entry):
    # Negative for every sample value of T (at most 7): never shape-correct.
    with pytest.raises(mp.ValidationError, match=r"^input 'y' axis 0: size .* is -\d+; an axis "
                                                 r"has 0 to 2147483647 elements"):
        mp.validate(program([], [{"input": 0}], dims={"T": {"max": 7}}, inputs=[
            {"name": "x", "shape": ["T"], "dtype": "float32"},
            {"name": "y", "shape": [entry], "dtype": "float32"}]))


def test_strings_naming_no_dim_are_not_numbers():
    # With dims declared, strings in integer attributes are dim expressions;
    # one naming no dim would be a number read from a string.
    summed = [{"op": "sum", "operands": [{"input": 0}], "attrs": {"axes": ["1"]}}]
    with pytest.raises(mp.ValidationError, match=r"^instruction 0 \(sum\): attribute 'axes': "
                                                 r"'1' is a string naming no dim"):
        mp.validate(program(summed, [{"result": 0}]))
    with pytest.raises(mp.ValidationError, match=r"^input 'x' axis 1: '4' is a string naming"):
        mp.validate(program([], [{"input": 0}],
                            inputs=[{"name": "x", "shape": ["T", "4"], "dtype": "float32"}]))


def test_input_shapes_beyond_int32_are_validation_errors():
    with pytest.raises(mp.ValidationError, match=r"^input 'y' axis 0: size 1073741824\*T is "
                                                 r"3221225472; an axis has 0 to 2147483647"):
        mp.validate(program([], [{"input": 0}], dims={"T": {"min": 3, "max": 3}}, inputs=[
            {"name": "x", "shape": ["T"], "dtype": "float32"},
            {"name": "y", "shape": ["T*1073741824"], "dtype": "float32"}]))


def test_symbolic_output_shapes_are_described():
    prog = program([
        {"op": "matmul", "operands": [{"input": 0}, {"input": 1}]},
        {"op": "reshape", "operands": [{"result": 0}], "attrs": {"shape": ["T*T"]}},
        {"op": "sum", "operands": [{"result": 0}], "attrs": {"axes": [0]}},
    ], [{"result": 0}, {"result": 1}, {"result": 2}],
        inputs=[{"name": "x", "shape": ["T", 4], "dtype": "float32"},
                {"name": "y", "shape": [4, "T"], "dtype": "float32"}])
    sym = mp.validate(prog)
    assert sym.describe_outputs() == ["float32[T, T]", "float32[T*T]", "float32[T]"]


# -- execution and the trace cache -------------------------------------------------------

def prefill_program() -> mp.Program:
    """x [T, 4] @ w, masked mean over the valid positions via a value_of input."""
    return program(
        [
            {"op": "matmul", "operands": [{"input": 0}, {"capture": 0}]},
            {"op": "tanh", "operands": [{"result": 0}]},
            {"op": "reshape", "operands": [{"result": 1}], "attrs": {"shape": ["T*4"]}},
            {"op": "sum", "operands": [{"result": 1}], "attrs": {"axes": [0]}},
            {"op": "astype", "operands": [{"input": 1}], "attrs": {"dtype": "float32"}},
            {"op": "divide", "operands": [{"result": 3}, {"result": 4}]},
        ],
        [{"result": 1}, {"result": 2}, {"result": 5}],
        inputs=[{"name": "x", "shape": ["T", 4], "dtype": "float32"},
                {"name": "length", "shape": [], "dtype": "int32", "value_of": "T"}],
        captures=[{"name": "w", "shape": [4, 4], "dtype": "float32"}],
    )


W = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)


def check_prefill(outs, x):
    ref = np.tanh(x @ W)
    np.testing.assert_allclose(np.array(outs[0]), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(outs[1]), ref.reshape(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(outs[2]), ref.mean(axis=0), rtol=1e-4, atol=1e-5)


def test_twenty_lengths_one_trace_per_binding():
    exe = mp.compile(prefill_program(), captures={"w": W}, max_traces=32)
    rng = np.random.default_rng(1)
    lengths = list(range(1, 21))
    for T in lengths + lengths[::3]:
        x = rng.normal(size=(T, 4)).astype(np.float32)
        check_prefill(exe(x), x)
    assert exe.stats.traces == 20
    assert exe.stats.cache_misses == 20 and exe.stats.cache_hits == 7
    assert exe.input_names == ["x"]  # the value_of input is filled by the Executable


def test_shape_polymorphic_program_is_one_shapeless_trace():
    prog = program([
        {"op": "tanh", "operands": [{"input": 0}]},
        {"op": "multiply", "operands": [{"result": 0}, {"const": 0}]},
        {"op": "add", "operands": [{"result": 1}, {"input": 0}]},
    ], [{"result": 2}], constants=[{"value": 2.0, "dtype": "float32"}])
    exe = mp.compile(prog, max_traces=32)
    for T in range(1, 21):
        x = np.linspace(-1, 1, 4 * T, dtype=np.float32).reshape(T, 4)
        np.testing.assert_allclose(np.array(exe(x)[0]), np.tanh(x) * 2 + x, rtol=1e-6)
    assert exe.stats.traces == 2  # T=1 is traced on its own (see the next test)
    assert exe.stats.as_dict()["shapeless_segments"] == 1
    assert len(exe.stats.segments) == 2


def test_dims_of_size_one_get_their_own_trace():
    # A reduction over an axis of size 1 crashes MLX's shapeless compilation;
    # such bindings must be traced normally (and this must not crash).
    prog = program([
        {"op": "multiply", "operands": [{"input": 0}, {"input": 0}]},
        {"op": "sum", "operands": [{"result": 0}], "attrs": {"axes": [0]}},
    ], [{"result": 1}])
    exe = mp.compile(prog)
    for T in [1, 3, 1, 5]:
        x = np.arange(4 * T, dtype=np.float32).reshape(T, 4)
        np.testing.assert_allclose(np.array(exe(x)[0]), (x * x).sum(axis=0))
    assert exe.stats.traces == 2  # T=1 on its own, one shapeless trace for 3 and 5
    assert exe.stats.as_dict()["shapeless_segments"] == 1


def test_lru_eviction_bounds_the_cache():
    exe = mp.compile(prefill_program(), captures={"w": W}, max_traces=2)
    for T in [3, 4, 3, 5, 3, 4]:
        x = np.ones((T, 4), np.float32)
        check_prefill(exe(x), x)
    stats = exe.stats
    # 3 miss, 4 miss, 3 hit, 5 miss (evicts 4), 3 hit, 4 miss (evicts 5)
    assert (stats.cache_misses, stats.cache_hits, stats.cache_evictions) == (4, 2, 2)
    assert sorted(b["T"] for b in stats.bindings) == [3, 4]
    assert len(stats.segments) == 2


def test_bucketing_pads_to_few_traces_and_unpads_outputs():
    exe = mp.compile(prefill_program(), captures={"w": W}, buckets={"T": "pow2"})
    rng = np.random.default_rng(2)
    for T in range(1, 17):
        x = rng.normal(size=(T, 4)).astype(np.float32)
        outs = exe(x)
        # Padding rows are zeros and tanh(0 @ w) = 0, so the sum is unchanged
        # and dividing by the true length (value_of) gives the true mean.
        check_prefill(outs, x)
    assert exe.stats.traces == 5  # buckets 1, 2, 4, 8, 16
    listed = mp.compile(prefill_program(), captures={"w": W}, buckets={"T": [8, 32]})
    for T in [3, 7, 9, 33]:
        x = np.ones((T, 4), np.float32)
        check_prefill(listed(x), x)
    assert sorted(b["T"] for b in listed.stats.bindings) == [8, 32, 33]


def test_bucket_policy_is_checked():
    with pytest.raises(mp.BindingError, match="unknown dim 'S'"):
        mp.compile(prefill_program(), captures={"w": W}, buckets={"S": "pow2"})
    with pytest.raises(mp.BindingError, match="'pow2' or a list"):
        mp.compile(prefill_program(), captures={"w": W}, buckets={"T": "linear"})


def test_symbolic_program_round_trips_and_runs_eagerly():
    prog = prefill_program()
    again = mp.Program.loads(prog.to_json())
    assert again == prog and json.loads(prog.to_json())["dims"] == {"T": {"max": 64}}
    x = np.ones((5, 4), np.float32)
    check_prefill(mp.compile(again, captures={"w": W}, eager=True)(x), x)


def test_static_programs_are_unaffected():
    b = mp.ProgramBuilder()
    x = b.input("x", (2,), "float32")
    exe = mp.compile(b.build([b.exp(x)]))
    assert not isinstance(exe.validated, SymbolicProgram)
    assert exe.stats.cache_misses == 0


# -- eager fallback ------------------------------------------------------------------------

@pytest.fixture
def untraceable_op():
    @mp.register_op("host_scale_test")
    def host_scale(operands, attrs):
        """Scales by a factor read from the data: fine eagerly, cannot be traced."""
        factor = operands[0].max().item()
        return operands[0] * factor

    yield "host_scale_test"
    mp.unregister_op("host_scale_test")


def test_untraceable_segment_falls_back_to_eager_with_one_warning(untraceable_op):
    b = mp.ProgramBuilder()
    x = b.input("x", (3,), "float32")
    prog = b.build([b.op(untraceable_op, x) + 1.0])
    exe = mp.compile(prog)
    x = np.array([1.0, 2.0, 3.0], np.float32)
    with pytest.warns(RuntimeWarning, match=r"instruction 0.*running it eagerly"):
        out = exe(x)[0]
    np.testing.assert_allclose(np.array(out), x * 3 + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(np.array(exe(x * 2)[0]), x * 2 * 6 + 1)
    assert exe.stats.fallbacks == 1 and exe.stats.segments[0].fallback


def test_fallback_raise_makes_it_an_error(untraceable_op):
    b = mp.ProgramBuilder()
    x = b.input("x", (3,), "float32")
    exe = mp.compile(b.build([b.op(untraceable_op, x)]), fallback="raise")
    with pytest.raises(mp.TraceError, match=r"segment starting at instruction 0 failed") as info:
        exe(np.ones(3, np.float32))
    assert info.value.__cause__ is not None


def test_binding_of_seen_input_shapes_is_remembered(monkeypatch):
    b = mp.ProgramBuilder("remember")
    b.dim("T", min=1)
    x = b.input("x", ["T", 3], "float32")
    exe = mp.compile(b.build([b.sum(x, axes=[1])]))
    calls = []
    real = bind_dims
    monkeypatch.setattr(dim_binding, "bind_dims", lambda *a: calls.append(1) or real(*a))
    for rows in (2, 2, 5, 2, 5):
        out = exe(np.ones((rows, 3), np.float32))[0]
        assert out.shape == (rows,)
    assert len(calls) == 2  # once per distinct shape
    with pytest.raises(mp.BindingError):  # a wrong shape is still an error, every time
        exe(np.ones((2, 4), np.float32))
    with pytest.raises(mp.BindingError):
        exe(np.ones((2, 4), np.float32))
