"""while, cond and runtime_call: semantics, validation, segmentation, traces."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlxprog as mp


def collatz_program() -> mp.Program:
    b = mp.ProgramBuilder("collatz")
    n = b.input("n", (), "int32")

    def body(sb, x, steps):
        even = sb.equal(sb.remainder(x, 2), 0)
        return sb.select(even, sb.quotient(x, 2), x * 3 + 1), steps + 1

    _, steps = b.while_loop(lambda sb, x, s: sb.greater(x, 1), body, [n, b.constant(0, "int32")])
    return b.build([steps])


def collatz_steps(n: int) -> int:
    steps = 0
    while n > 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


@settings(max_examples=15, deadline=None)
@given(st.integers(min_value=1, max_value=3000))
def test_collatz_trip_counts_match_python(n):
    exe = mp.compile(collatz_program())
    assert exe(n)[0].item() == collatz_steps(n)


def test_newton_sqrt_to_tolerance():
    b = mp.ProgramBuilder("newton")
    a = b.input("a", (), "float32")

    def cond(sb, x):
        return sb.greater(sb.abs(x * x - a), 1e-5)

    def body(sb, x):
        return (x + a / x) * 0.5

    (root,) = b.while_loop(cond, body, [a])
    exe = mp.compile(b.build([root]))
    for value in [2.0, 10.0, 0.25, 1.0]:
        x, iterations = value, 0
        while abs(x * x - value) > 1e-5:
            x, iterations = (x + value / x) * 0.5, iterations + 1
        before = exe.stats.loop_iterations
        got = exe(value)[0].item()
        assert got == pytest.approx(math.sqrt(value), rel=1e-5)
        assert exe.stats.loop_iterations - before == iterations


def test_nested_loops_and_inputs_seen_inside():
    # total = sum_{i<n} sum_{j<i} (j + offset); offset is a program input read
    # directly by the inner body, not carried.
    b = mp.ProgramBuilder("nested")
    n = b.input("n", (), "int32")
    offset = b.input("offset", (), "int32")

    def outer_body(sb, i, total):
        def inner_body(ib, j, acc, limit):
            return j + 1, acc + j + offset, limit

        _, inner_total, _ = sb.while_loop(
            lambda ib, j, acc, limit: ib.less(j, limit), inner_body,
            [sb.constant(0, "int32"), sb.constant(0, "int32"), i],
        )
        return i + 1, total + inner_total

    zero = b.constant(0, "int32")
    _, total = b.while_loop(lambda sb, i, t: sb.less(i, n), outer_body, [zero, zero])
    prog = b.build([total])
    for eager in (False, True):
        exe = mp.compile(prog, eager=eager)
        for size, off in [(0, 0), (1, 5), (6, 2)]:
            expected = sum(j + off for i in range(size) for j in range(i))
            assert exe(size, off)[0].item() == expected


def test_zero_iteration_loop_returns_initial_carry():
    b = mp.ProgramBuilder()
    x = b.input("x", (3,), "float32")
    (out,) = b.while_loop(lambda sb, v: sb.less(sb.constant(1, "int32"), 0),
                          lambda sb, v: v * 2.0, [x])
    exe = mp.compile(b.build([out]))
    np.testing.assert_array_equal(np.array(exe(np.arange(3, dtype=np.float32))[0]), [0, 1, 2])
    assert exe.stats.loop_iterations == 0


def runaway_program(max_iterations=None) -> mp.Program:
    b = mp.ProgramBuilder("runaway")
    x = b.input("x", (), "int32")
    (out,) = b.while_loop(lambda sb, v: sb.greater_equal(v, 0), lambda sb, v: v + 1, [x],
                          max_iterations=max_iterations)
    return b.build([out])


def test_loop_limit_from_attribute_and_executable_default():
    with pytest.raises(mp.LoopLimitError, match=r"instruction 0 \(while\).*max_iterations=7"):
        mp.compile(runaway_program(7))(0)
    with pytest.raises(mp.LoopLimitError, match="max_iterations=20"):
        mp.compile(runaway_program(), max_iterations=20)(0)
    with pytest.raises(mp.LoopLimitError):
        mp.compile(runaway_program(5), eager=True)(0)


def while_json(body_outputs, cond_outputs='[{"result": 1}]', cond_op="less"):
    return f"""{{"format": "mlxprog", "version": 1,
      "inputs": [{{"name": "x", "shape": [2], "dtype": "float32"}}],
      "constants": [{{"value": 1.0, "dtype": "float32"}}, {{"value": [1.0, 2.0, 3.0], "dtype": "float32"}}],
      "instructions": [{{"op": "while", "operands": [{{"input": 0}}],
        "subprograms": {{
          "cond": {{"instructions": [{{"op": "sum", "operands": [{{"carry": 0}}]}},
                                    {{"op": "{cond_op}", "operands": [{{"result": 0}}, {{"const": 0}}]}}],
                   "outputs": {cond_outputs}}},
          "body": {{"instructions": [{{"op": "add", "operands": [{{"carry": 0}}, {{"const": 0}}]}}],
                   "outputs": {body_outputs}}}}}}}],
      "outputs": [{{"result": 0}}]}}"""


def test_carry_shape_mismatch_rejected_at_validation():
    prog = mp.Program.loads(while_json('[{"const": 1}]'))
    with pytest.raises(mp.ValidationError, match=r"instruction 0 > body.*output 0 is float32\[3\]"):
        mp.validate(prog)
    prog = mp.Program.loads(while_json('[{"result": 0}, {"result": 0}]'))
    with pytest.raises(mp.ValidationError, match="instruction 0 > body: outputs 2 value"):
        mp.validate(prog)


def test_cond_subprogram_must_output_a_bool_scalar():
    prog = mp.Program.loads(while_json('[{"result": 0}]', cond_outputs='[{"result": 0}]'))
    with pytest.raises(mp.ValidationError, match=r"instruction 0 > cond: must output one bool scalar"):
        mp.validate(prog)


def test_errors_inside_subprograms_name_the_path():
    prog = mp.Program.loads(while_json('[{"result": 0}]', cond_op="lesss"))
    with pytest.raises(mp.ValidationError,
                       match=r"instruction 0 > cond > instruction 1 \(lesss\): unknown op.*'less'"):
        mp.validate(prog)
    prog = mp.Program.loads(while_json('[{"result": 3}]'))
    with pytest.raises(mp.ValidationError, match=r"instruction 0 > body > outputs.*result 3"):
        mp.validate(prog)


def test_missing_subprogram_rejected():
    text = while_json('[{"result": 0}]').replace('"cond": {', '"cnd": {')
    with pytest.raises(mp.ValidationError, match=r"takes subprograms \(cond, body\)"):
        mp.validate(mp.Program.loads(text))


def branch_program() -> mp.Program:
    b = mp.ProgramBuilder("branch")
    flag = b.input("flag", (), "bool")
    x = b.input("x", (2,), "float32")
    (out,) = b.cond(flag, lambda sb, v: sb.exp(v), lambda sb, v: -v, [x])
    return b.build([out])


def test_cond_runs_only_the_taken_branch():
    prog = branch_program()
    x = np.array([0.0, 1.0], np.float32)
    for eager in (False, True):
        exe = mp.compile(prog, eager=eager)
        np.testing.assert_allclose(np.array(exe(True, x)[0]), np.exp(x), rtol=1e-6)
        np.testing.assert_allclose(np.array(exe(False, x)[0]), -x)


def test_cond_branch_outputs_must_match_and_predicate_must_be_scalar():
    b = mp.ProgramBuilder()
    flag = b.input("flag", (), "bool")
    x = b.input("x", (2,), "float32")
    with pytest.raises(mp.ValidationError, match=r"> else: output 0 is int32\[2\]"):
        b.cond(flag, lambda sb, v: v, lambda sb, v: sb.astype(v, dtype="int32"), [x])
    with pytest.raises(mp.ValidationError, match="predicate.*bool or integer scalar"):
        b.cond(x, lambda sb, v: v, lambda sb, v: v, [x])


def test_cond_takes_integer_predicates():
    b = mp.ProgramBuilder()
    k = b.input("k", (), "int32")
    (out,) = b.cond(k, lambda sb, v: v + 1, lambda sb, v: v - 1, [k])
    exe = mp.compile(b.build([out]))
    assert exe(0)[0].item() == -1 and exe(5)[0].item() == 6


def logging_program() -> mp.Program:
    b = mp.ProgramBuilder("logging")
    x = b.input("x", (3,), "float32")
    y = b.exp(x)
    b.runtime_call("observe", [y])  # nobody uses its (zero) results: must still fire
    (scaled,) = b.runtime_call("scale", [y], [((3,), "float32")])
    return b.build([scaled + 1.0])


def test_callbacks_fire_every_call_in_order_and_feed_later_segments():
    events = []

    def observe(v):
        events.append(("observe", np.array(v).tolist()))

    def scale(v):
        events.append(("scale",))
        return np.array(v) * 2

    exe = mp.compile(logging_program(), callbacks={"observe": observe, "scale": scale})
    x = np.zeros(3, np.float32)
    for _ in range(3):
        out = exe(x)[0]
        np.testing.assert_allclose(np.array(out), [3.0, 3.0, 3.0])
    assert events == [("observe", [1.0, 1.0, 1.0]), ("scale",)] * 3
    assert exe.stats.callback_calls == 6
    assert exe.stats.traces == 2  # one per compiled segment, never again


def test_callback_result_mismatch_is_a_clear_error():
    bad = {
        "shape": (lambda v: np.zeros(4, np.float32), r"output 0 is float32\[4\], declared float32\[3\]"),
        "dtype": (lambda v: np.zeros(3, np.float64), r"output 0 is float64\[3\], declared float32\[3\]"),
        "count": (lambda v: (v, v), "returned 2 value"),
    }
    for make, pattern in bad.values():
        exe = mp.compile(logging_program(), callbacks={"observe": lambda v: None, "scale": make})
        with pytest.raises(mp.CallbackError, match=r"instruction 2 \(runtime_call 'scale'\).*" + pattern):
            exe(np.zeros(3, np.float32))


def test_callback_exception_is_chained():
    def broken(v):
        raise KeyError("boom")

    exe = mp.compile(logging_program(), callbacks={"observe": broken, "scale": lambda v: v})
    with pytest.raises(mp.CallbackError, match=r"instruction 1 .*'observe'.*KeyError") as info:
        exe(np.zeros(3, np.float32))
    assert isinstance(info.value.__cause__, KeyError)


def test_unknown_callback_is_a_compile_time_error():
    with pytest.raises(mp.BindingError, match=r"instruction 1 \(runtime_call\) names callback 'observe'"):
        mp.compile(logging_program(), callbacks={"scale": lambda v: v})


def test_callback_inside_loop_fires_per_iteration():
    b = mp.ProgramBuilder()
    n = b.input("n", (), "int32")

    def body(sb, i):
        sb.runtime_call("tick", [i])
        return i + 1

    (out,) = b.while_loop(lambda sb, i: sb.less(i, n), body, [b.constant(0, "int32")])
    seen = []
    exe = mp.compile(b.build([out]), callbacks={"tick": lambda i: seen.append(i.item())})
    assert exe(4)[0].item() == 4
    assert seen == [0, 1, 2, 3]


def mixed_program() -> mp.Program:
    b = mp.ProgramBuilder("mixed")
    x = b.input("x", (4,), "float32")
    limit = b.input("limit", (), "float32")
    y = b.tanh(x) + 2.0
    grown, count = b.while_loop(
        lambda sb, v, k: sb.all(sb.less(v, limit)),
        lambda sb, v, k: (v * 1.5, k + 1),
        [y, b.constant(0, "int32")],
    )
    (checked,) = b.runtime_call("check", [grown], [((4,), "float32")])
    (picked,) = b.cond(b.greater(count, 2), lambda sb, v: v - 1.0, lambda sb, v: v + 1.0,
                       [checked])
    return b.build([picked * 2.0, count])


def test_mixed_program_compiled_and_eager_agree_and_never_retrace():
    prog = mixed_program()
    callbacks = {"check": lambda v: v}
    compiled = mp.compile(prog, callbacks=callbacks)
    eager = mp.compile(prog, callbacks=callbacks, eager=True)
    rng = np.random.default_rng(0)
    for _ in range(100):
        x = rng.normal(size=4).astype(np.float32)
        limit = np.float32(rng.uniform(3, 40))
        got, count = compiled(x, limit)
        want, want_count = eager(x, limit)
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-6)
        assert count.item() == want_count.item()
    # Segments: top-level tanh/add, loop cond, loop body, then, else, and the
    # final multiply; each traced exactly once over 100 calls.
    assert compiled.stats.segments and all(s.traces == 1 for s in compiled.stats.segments
                                           if s.calls)
    assert compiled.stats.calls == 100


def test_program_without_host_ops_is_one_segment():
    b = mp.ProgramBuilder()
    x = b.input("x", (2,), "float32")
    exe = mp.compile(b.build([b.exp(x) + 1.0]))
    assert len(exe.stats.segments) == 1


def test_segments_hand_on_only_live_values():
    b = mp.ProgramBuilder()
    x = b.input("x", (2,), "float32")
    dead = b.exp(x)            # used only before the boundary
    kept = b.log1p(b.abs(x))   # used after the boundary
    before = dead + 1.0
    b.runtime_call("noop", [before])
    out = kept * 2.0
    exe = mp.compile(b.build([out]), callbacks={"noop": lambda v: None})
    first = exe._body.units[0]
    assert len(first.writes) == 2  # `before` (callback operand) and `kept`
    np.testing.assert_allclose(np.array(exe(np.array([1.0, -2.0], np.float32))[0]),
                               2 * np.log1p([1.0, 2.0]), rtol=1e-6)


def test_while_program_round_trips_through_json():
    prog = collatz_program()
    again = mp.Program.loads(prog.to_json())
    assert again == prog
    assert mp.compile(again)(27)[0].item() == collatz_steps(27)


def test_with_callbacks_replaces_them_for_its_calls_only():
    events = []
    exe = mp.compile(logging_program(), callbacks={
        "observe": lambda v: events.append("compiled"), "scale": lambda v: v})
    x = np.zeros(3, np.float32)
    exe(x)
    mine = exe.with_callbacks({"observe": lambda v: events.append("mine")})
    out = mine(x=x)[0]  # inputs as the executable takes them; "scale" stays
    np.testing.assert_allclose(np.array(out), [2.0, 2.0, 2.0])
    exe(x)
    assert events == ["compiled", "mine", "compiled"]
    # One executable: the calls share its segments (no new traces) and stats.
    assert exe.stats.traces == 2 and exe.stats.calls == 3
    with pytest.raises(mp.BindingError, match="callback 'observe' must be callable, got int"):
        exe.with_callbacks({"observe": 3})


def test_with_callbacks_nests():
    # A callback may call the executable again with callbacks of its own.
    events = []
    exe = mp.compile(logging_program(), callbacks={"observe": lambda v: None,
                                                   "scale": lambda v: v})
    x = np.zeros(3, np.float32)
    inner = exe.with_callbacks({"observe": lambda v: events.append("inner")})

    def outer(v):
        events.append("outer")
        inner(x)
        events.append("outer again")

    exe.with_callbacks({"observe": outer})(x)
    assert events == ["outer", "inner", "outer again"]
