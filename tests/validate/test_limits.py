"""Resource limits: every result's size, all results together, results per
instruction, subprogram nesting, instructions, loop iterations; static sizes
at validation, symbolic ones when a binding is specialised (before it runs)."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

import mlxprog as mp
from helpers import run_isolated

H = {"format": "mlxprog", "version": 1}


def program(**fields) -> mp.Program:
    return mp.Program.from_dict({**H, **fields})


def eye(n: int) -> mp.Program:
    return program(instructions=[{"op": "eye", "attrs": {"n": n}}], outputs=[{"result": 0}])


def test_a_result_larger_than_the_limit_is_rejected_at_validation():
    with pytest.raises(mp.ValidationError) as info:
        mp.validate(eye(1_000_000))
    assert "instruction 0 (eye): result 0 is float32[1000000, 1000000]" in str(info.value)
    assert "Limits.max_elements" in str(info.value)
    assert mp.validate(eye(100), mp.Limits(max_elements=10_000)).out_avals[0].shape == (100, 100)
    with pytest.raises(mp.ValidationError, match="10,201 elements"):
        mp.validate(eye(101), mp.Limits(max_elements=10_000))
    with pytest.raises(mp.ValidationError, match="max_elements"):
        mp.compile(eye(101), limits=mp.Limits(max_elements=10_000))


@pytest.mark.parametrize("instruction", [
    {"op": "full", "attrs": {"shape": [100000, 100000], "dtype": "float32", "value": 1}},
    {"op": "iota", "attrs": {"shape": [100000, 100000]}},
    {"op": "arange", "attrs": {"stop": 1e12}},
])
def test_attribute_sized_results_are_bounded(instruction):
    with pytest.raises(mp.ValidationError, match=r"instruction 0 \("):
        mp.validate(program(instructions=[instruction], outputs=[{"result": 0}]),
                    mp.Limits(max_elements=10**8))


def test_all_results_together_are_bounded():
    prog = program(inputs=[{"name": "x", "shape": [100], "dtype": "float32"}],
                   instructions=[{"op": "exp", "operands": [{"input": 0}]},
                                 {"op": "exp", "operands": [{"result": 0}]},
                                 {"op": "exp", "operands": [{"result": 1}]}],
                   outputs=[{"result": 2}])
    mp.validate(prog, mp.Limits(max_total_elements=300))
    with pytest.raises(mp.ValidationError, match=r"instruction 2 \(exp\): the program's results "
                                                 r"hold 300 elements.*max_total_elements"):
        mp.validate(prog, mp.Limits(max_total_elements=299))


@pytest.mark.parametrize("instruction, inputs", [
    ({"op": "random_split", "operands": [{"result": 0}], "attrs": {"num": 1_000_000}}, []),
    ({"op": "split", "operands": [{"input": 0}], "attrs": {"indices_or_sections": 10_000_000}},
     [{"name": "x", "shape": [0], "dtype": "float32"}]),
])
def test_result_counts_are_bounded_before_the_op_runs(instruction, inputs):
    key = [{"op": "random_key", "attrs": {"seed": 1}}] if not inputs else []
    prog = program(inputs=inputs, instructions=[*key, instruction], outputs=[])
    with pytest.raises(mp.ValidationError, match=r"makes [\d,]+ results: more than the limit "
                                                 r"of 4,096 \(Limits.max_results\)"):
        mp.validate(prog)


def nested_loops(depth: int) -> mp.Program:
    b = mp.ProgramBuilder("nested")
    n = b.input("n", (), "int32")

    def body(level):
        def make(sb, i):
            if level == 1:
                return [i + 1]
            (inner,) = sb.while_loop(lambda cb, j: cb.less(j, n), body(level - 1), [i])
            return [inner + 1]
        return make

    (out,) = b.while_loop(lambda sb, i: sb.less(i, n), body(depth), [n])
    return b.build([out])


def test_subprogram_nesting_is_bounded():
    prog = nested_loops(3)
    mp.validate(prog, mp.Limits(max_depth=3))
    with pytest.raises(mp.ValidationError, match=r"instruction 0 > body > instruction 0 > body "
                                                 r"> instruction 0 > cond: subprograms nest 3 "
                                                 r"deep.*Limits.max_depth"):
        mp.validate(prog, mp.Limits(max_depth=2))


def test_instructions_are_bounded():
    prog = program(inputs=[{"name": "x", "shape": [2], "dtype": "float32"}],
                   instructions=[{"op": "exp", "operands": [{"input": 0}]}] * 5,
                   outputs=[{"result": 4}])
    mp.validate(prog, mp.Limits(max_instructions=5))
    with pytest.raises(mp.ValidationError, match="instruction 5: the program has more than 5 "):
        mp.validate(mp.Program.from_dict({**prog.to_dict(), "instructions": [
            {"op": "exp", "operands": [{"input": 0}]}] * 6}), mp.Limits(max_instructions=5))


def test_limits_must_be_positive_integers():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(mp.ProgramError, match="Limits.max_depth must be a positive integer"):
            mp.Limits(max_depth=bad)


def test_a_symbolic_binding_is_held_to_the_limits_before_it_runs():
    b = mp.ProgramBuilder("square")
    b.dim("T", max=10_000)
    x = b.input("x", ["T"], "float32")
    ones = b.full(shape=["T", "T"], dtype="float32", value=1.0)
    exe = mp.compile(b.build([b.add(ones, x)]), limits=mp.Limits(max_elements=2_500))
    assert np.array(exe(np.ones(50, np.float32))[0]).shape == (50, 50)
    with pytest.raises(mp.ValidationError, match=r"float32\[51, 51\], 2,601 elements.*"
                                                 r"\(with dims T=51\)"):
        exe(np.ones(51, np.float32))


@pytest.mark.parametrize("own, caller, expected", [
    (1_000_000_000, 10, 10), (2**63 - 1, 10, 10), (7, 10, 7), (None, 10, 10)])
def test_the_smaller_loop_limit_wins(own, caller, expected):
    b = mp.ProgramBuilder("forever")
    n = b.input("n", (), "int32")
    (out,) = b.while_loop(lambda sb, i: sb.greater_equal(i, 0), lambda sb, i: [i + 1], [n],
                          max_iterations=own)
    exe = mp.compile(b.build([out]), max_iterations=caller)
    with pytest.raises(mp.LoopLimitError, match=f"max_iterations={expected}$"):
        exe(0)


def forever() -> mp.Program:
    b = mp.ProgramBuilder("forever")
    n = b.input("n", (), "int32")
    (out,) = b.while_loop(lambda sb, i: sb.greater_equal(i, 0), lambda sb, i: [i + 1], [n])
    return b.build([out])


@pytest.mark.parametrize("eager", [False, True])
def test_a_runaway_loop_stops_at_the_time_limit_long_before_the_iteration_limit(eager):
    exe = mp.compile(forever(), eager=eager, limits=mp.Limits(max_loop_seconds=0.25))
    start = time.monotonic()
    with pytest.raises(mp.LoopLimitError, match=r"^instruction 0 \(while\): loop did not finish "
                                                r"within 0\.25 s \(Limits\.max_loop_seconds; "
                                                r"[\d,]+ iterations run\)$"):
        exe(0)
    # Far fewer than the million iterations of the default count limit.
    assert time.monotonic() - start < 5


def test_a_validated_program_keeps_its_loop_time_limit_and_inf_lifts_it():
    validated = mp.validate(forever(), mp.Limits(max_loop_seconds=0.25))
    with pytest.raises(mp.LoopLimitError, match="0.25 s"):
        mp.compile(validated)(0)
    unbounded = mp.compile(forever(), max_iterations=2_000,
                           limits=mp.Limits(max_loop_seconds=math.inf))
    with pytest.raises(mp.LoopLimitError, match="max_iterations=2000$"):
        unbounded(0)


def test_the_default_loop_time_limit_is_seconds():
    assert mp.Limits().max_loop_seconds == 10
    for bad in (0, -1.0, "10", True, math.nan):
        with pytest.raises(mp.ProgramError, match="Limits.max_loop_seconds must be a positive"):
            mp.Limits(max_loop_seconds=bad)


@pytest.mark.parametrize("op", ["sum", "mean", "var", "reduce_max", "any", "product",
                                "softmax", "logsumexp"])
def test_reducing_a_static_size_one_axis_of_a_symbolic_program(op):
    prog = json.dumps({**H, "dims": {"T": {}},
                       "inputs": [{"name": "x", "shape": [1, "T"], "dtype": "float32"}],
                       "instructions": [{"op": op, "operands": [{"input": 0}],
                                         "attrs": {"axes": [0]}}],
                       "outputs": [{"result": 0}]})
    out = run_isolated(f"""
exe = mp.compile(mp.Program.loads({prog!r}))
for t in (3, 5, 3, 8):
    out = np.array(exe(np.arange(t, dtype=np.float32)[None, :] + 1)[0])
    ref = np.array(mp.compile(mp.Program.loads({prog!r}), eager=True)(
        np.arange(t, dtype=np.float32)[None, :] + 1)[0])
    assert out.shape == ref.shape and np.allclose(out, ref, equal_nan=True), (out, ref)
print("ok")
""")
    assert out.strip() == "ok"


def test_the_default_limits_follow_the_memory_the_process_may_use():
    out = run_isolated("""
import resource
resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, resource.RLIM_INFINITY))
print(mp.Limits().max_elements)
""")
    assert int(out) == 4 * 2**30 // 16
