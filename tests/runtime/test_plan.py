"""Planning: plan_block is pure, splits at host steps, hands on only live
values, and marks segments shapeless by step path."""

from __future__ import annotations

import mlxprog as mp
from mlxprog.runtime.plan import HostPlan, SegmentPlan, describe, plan_block


def callback_program() -> mp.Program:
    b = mp.ProgramBuilder("plan")
    x = b.input("x", (2,), "float32")
    dead = b.exp(x)            # used only before the host step
    kept = b.log1p(b.abs(x))   # used after it
    (y,) = b.runtime_call("cb", [dead + 1.0], [((2,), "float32")])
    return b.build([kept * y])


def test_a_host_step_splits_the_block_and_liveness_decides_the_writes():
    validated = mp.validate(callback_program())
    plan = plan_block(validated.block, n_inputs=1)
    kinds = [type(u) for u in plan.units]
    assert kinds == [SegmentPlan, HostPlan, SegmentPlan]
    first, host, last = plan.units
    assert host.step.spec.name == "runtime_call"
    # The callback operand and `kept` leave the first segment; `dead` does not.
    assert len(first.writes) == 2
    assert first.reads == (0,)  # the input; the constant 1.0 is closed over
    assert set(last.reads) <= set(first.writes) | set(host.step.results)
    assert not plan.single_segment
    assert plan_block(validated.block, 1) == plan  # pure: the same plan again


def test_release_plan_frees_each_result_after_its_last_use():
    validated = mp.validate(callback_program())
    plan = plan_block(validated.block, 1)
    outputs = set(validated.block.outputs)
    released = [slot for slots in plan.release for slot in slots]
    assert len(released) == len(set(released))
    assert not outputs & set(released)


def test_shapeless_is_decided_by_dim_dependent_step_paths():
    b = mp.ProgramBuilder("sym")
    b.dim("T")
    x = b.input("x", ["T"], "float32")
    ones = b.full(shape=["T"], dtype="float32", value=1.0)  # shapeless, but its attrs use T
    sym = mp.validate(b.build([b.tanh(x) + ones]))
    assert sym.dim_dependent == frozenset({(0,)})  # the full, by path
    (segment,) = plan_block(sym.sample.block, 1, sym.dim_dependent).units
    assert not segment.shapeless
    (static,) = plan_block(sym.sample.block, 1, frozenset()).units
    assert static.shapeless
    (never,) = plan_block(sym.sample.block, 1, None).units
    assert not never.shapeless  # static programs are never shapeless


def test_dim_dependent_paths_inside_subprograms():
    b = mp.ProgramBuilder("nested")
    b.dim("T")
    x = b.input("x", ["T"], "float32")

    def body(sb, v):
        return [sb.reshape(sb.reshape(v, shape=[1, "T"]), shape=["T"])]

    (out,) = b.cond(b.constant(True, "bool"), body, lambda sb, v: [v], [x])
    sym = mp.validate(b.build([out]))
    assert sym.dim_dependent == frozenset({(0, "then", 0), (0, "then", 1)})


def test_describe_lists_segments_and_host_steps_with_subprograms():
    b = mp.ProgramBuilder("loop")
    n = b.input("n", (), "int32")
    (out,) = b.while_loop(lambda sb, i: sb.less(i, n), lambda sb, i: [i + 1], [n])
    validated = mp.validate(b.build([b.negate(out)]))
    assert describe(validated.block, 1) == [
        "host: instruction 0 (while)",
        "  segment: instruction 0 > cond > instruction 0 (1 op(s), compiled)",
        "  segment: instruction 0 > body > instruction 0 (1 op(s), compiled)",
        "segment: instruction 1 (1 op(s), compiled)",
    ]


def test_steps_carry_structural_paths_and_render_locations_from_them():
    b = mp.ProgramBuilder("paths")
    n = b.input("n", (), "int32")
    (out,) = b.while_loop(lambda sb, i: sb.less(i, n), lambda sb, i: [i + 1], [n])
    validated = mp.validate(b.build([out]))
    loop = validated.block.steps[0]
    inner = loop.blocks["body"].steps[0]
    assert loop.path == (0,) and inner.path == (0, "body", 0)
    assert inner.location == "instruction 0 > body > instruction 0"
    assert loop.blocks["body"].path == (0, "body")
