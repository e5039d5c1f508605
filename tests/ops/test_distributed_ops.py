"""Distributed ops in one process (world size 1: collectives are the
identity), shape rules, attribute and world-size checks, compile-time group
checks. Runs on several ranks are in tests/test_distributed.py."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from mlxprog.ops.context import GroupInfo
from mlxprog.ops.registry import RegistryError


def _program(world_size, make, shape=(4, 6)):
    b = mp.ProgramBuilder("dist", world_size=world_size)
    x = b.input("x", list(shape))
    out = make(b, x)
    return b.build(list(out) if isinstance(out, tuple) else [out])


@pytest.mark.parametrize("op", ["all_sum", "all_max", "all_min", "all_gather", "sum_scatter"])
@pytest.mark.parametrize("eager", [False, True])
def test_world_size_one_is_the_identity(op, eager):
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    program = _program(1, lambda b, v: b.op(op, v))
    exe = mp.compile(mp.Program.loads(program.to_json()), eager=eager)
    assert (exe.rank, exe.world_size) == (0, 1)
    assert isinstance(exe.group, mx.distributed.Group)
    (out,) = exe(x)
    assert out.dtype == mx.float32
    np.testing.assert_array_equal(np.array(out), x)


def test_rank_and_world_size():
    program = _program(1, lambda b, v: (b.rank(), b.world_size()))
    rank, size = mp.run(program, np.zeros((4, 6), np.float32))
    assert (rank.item(), size.item(), rank.dtype, rank.shape) == (0, 1, mx.int32, ())


@pytest.mark.parametrize("make, shape", [
    (lambda b, x: b.all_gather(x), (12, 6)),
    (lambda b, x: b.all_gather(x, axis=1), (4, 18)),
    (lambda b, x: b.all_gather(x, axis=-1), (4, 18)),
    (lambda b, x: b.sum_scatter(x, axis=1), (4, 2)),
    (lambda b, x: b.all_sum(x), (4, 6)),
    (lambda b, x: b.send(x, dst=2), (4, 6)),
    (lambda b, x: b.recv(shape=[2, 5], dtype="int8", src=1), (2, 5)),
])
def test_shape_rules(make, shape):
    program = _program(3, make, shape=(4, 6))
    validated = mp.validate(program)
    assert validated.out_avals[0].shape == shape


def test_recv_dtype():
    program = _program(2, lambda b, x: b.recv(shape=[3], dtype="int8", src=1))
    assert mp.validate(program).out_avals[0].dtype == mx.int8


@pytest.mark.parametrize("make, message", [
    (lambda b, x: b.sum_scatter(x), "attribute 'axis': axis 0 has length 4, which does not "
                                    "divide by the world size 3"),
    (lambda b, x: b.all_gather(x, axis=2), "axis"),
    (lambda b, x: b.send(x, dst=3), "attribute 'dst': rank 3 is not in a group of world size 3"),
    (lambda b, x: b.send(x, dst=-1), "dst"),
    (lambda b, x: b.recv(shape=[2], dtype="float32", src=5), "attribute 'src'"),
    (lambda b, x: b.recv(shape=[2], dtype="float32"), "src"),
    (lambda b, x: b.all_sum(x, axis=0), "axis"),
])
def test_bad_attributes_name_the_instruction(make, message):
    with pytest.raises(mp.ValidationError, match="instruction 0") as info:
        _program(3, make)
    assert message in str(info.value)


@pytest.mark.parametrize("op", ["all_sum", "all_gather", "sum_scatter", "rank", "world_size",
                                "send", "recv"])
def test_undeclared_world_size(op):
    attrs = {"send": {"dst": 1}, "recv": {"shape": [2], "dtype": "float32", "src": 1}}
    operands = [] if op in ("rank", "world_size", "recv") else [{"input": 0}]
    program = mp.Program.from_dict({
        "format": "mlxprog", "version": 1,
        "inputs": [{"name": "x", "shape": [4], "dtype": "float32"}],
        "instructions": [{"op": "exp", "operands": [{"input": 0}]},
                         {"op": op, "operands": operands, "attrs": attrs.get(op, {})}],
        "outputs": [{"result": 1}],
    })
    with pytest.raises(mp.ValidationError, match=rf"instruction 1 \({op}\): .*declare world_size"):
        mp.validate(program)


@pytest.mark.parametrize("op", ["send", "recv"])
def test_point_to_point_needs_two_ranks(op):
    make = (lambda b, x: b.send(x, dst=0)) if op == "send" else \
        (lambda b, x: b.recv(shape=[1], dtype="float32", src=0))
    with pytest.raises(mp.ValidationError, match=rf"instruction 0 \({op}\): needs world_size of "
                                                 r"at least 2; the program declares 1"):
        _program(1, make)


def test_world_size_field():
    program = _program(2, lambda b, x: b.all_sum(x))
    assert program.world_size == 2
    assert mp.Program.loads(program.to_json()).world_size == 2
    assert "world_size" not in mp.Program().to_dict()
    for bad in (0, -1, "2", True):
        with pytest.raises(mp.FormatError, match="world_size"):
            mp.Program.from_dict({"format": "mlxprog", "version": 1, "world_size": bad})
    with pytest.raises(mp.ValidationError, match="world_size"):
        mp.ProgramBuilder("x", world_size=0)


def test_size_mismatch_at_compile():
    program = _program(2, lambda b, x: b.all_sum(x))
    with pytest.raises(mp.ProgramError, match=r"the program was built for world size 2; the "
                                              r"group has 1 rank\(s\)"):
        mp.compile(program)


def test_group_needs_a_declared_world_size():
    program = _program(None, lambda b, x: b.exp(x))
    with pytest.raises(mp.ProgramError, match="declares no world_size"):
        mp.compile(program, group=mx.distributed.init())
    exe = mp.compile(program)
    assert (exe.group, exe.rank, exe.world_size) == (None, 0, 1)
    with pytest.raises(mp.ProgramError, match="mx.distributed.Group"):
        mp.compile(_program(1, lambda b, x: b.all_sum(x)), group="ring")


@pytest.mark.parametrize("op, attrs, rank, ring, message", [
    ("send", {"dst": 1}, 1, False, "attribute 'dst': rank 1 is this rank"),
    ("recv", {"src": 2, "shape": [1], "dtype": "float32"}, 0, True,
     "attribute 'src': the ring backend reaches only the neighbouring ranks [1, 3] of rank 0; "
     "found 2"),
])
def test_group_checks(op, attrs, rank, ring, message):
    spec = mp.lookup(op)
    with pytest.raises(ValueError) as info:
        spec.group_check(spec.attrs(**attrs), GroupInfo(None, rank, 4, ring))
    assert str(info.value) == message
    # Without the ring, any other rank is reachable.
    spec.group_check(spec.attrs(**attrs), GroupInfo(None, (rank + 1) % 4, 4, False))


def test_distributed_ops_are_never_shapeless():
    for name in ("all_sum", "all_gather", "sum_scatter", "send", "recv", "rank"):
        spec = mp.lookup(name)
        assert spec.distributed is not None and not spec.shapeless
    with pytest.raises(RegistryError, match="cannot be shapeless"):
        mp.register_op("test_shapeless_collective", distributed="collective",
                       shapeless=True)(lambda operands, attrs: operands[0])
    assert mp.lookup("test_shapeless_collective") is None


def test_symbolic_program_with_collectives():
    b = mp.ProgramBuilder("sym", world_size=1)
    t = b.dim("T")
    x = b.input("x", [t, 4])
    program = b.build([b.all_gather(b.exp(x), axis=0)])
    exe = mp.compile(program)
    for n in (2, 5):
        x = np.ones((n, 4), np.float32)
        np.testing.assert_allclose(np.array(exe(x)[0]), np.exp(x), rtol=1e-6)
    # The collective's segment is never shapeless.
    assert exe.stats.as_dict()["shapeless_segments"] == 0


def test_kept_send_results_join_the_plan():
    from mlxprog.runtime.plan import plan_block
    validated = mp.validate(_program(2, lambda b, x: (b.send(x, dst=1), b.exp(x))[1]))
    plan = plan_block(validated.block, 1)
    assert plan.kept == (validated.block.steps[0].out,)
    assert plan.kept[0] in plan.units[0].writes
