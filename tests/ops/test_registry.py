"""User ops: ``register_op`` with a typed attrs model, used from JSON and the
builder; duplicates, ``replace=True``, multi-output ops, bad implementations."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest

import mlxprog as mp
from helpers import assert_close
from mlxprog.ops.attrs import Axis, Float
from mlxprog.ops.registry import RegistryError


class ScaleAttrs(mp.Attrs):
    factor: Float
    offset: float = 0.0


class HalvesAttrs(mp.Attrs):
    axis: Axis = -1


@pytest.fixture
def user_ops():
    """Registers the test ops and unregisters them afterwards."""

    @mp.register_op("test_scale", attrs=ScaleAttrs)
    def scale(operands, attrs):
        """``x * factor + offset``."""
        return operands[0] * attrs.factor + attrs.offset

    @mp.register_op("test_halves", attrs=HalvesAttrs, outputs=2)
    def halves(operands, attrs):
        """Split ``axis`` into two halves."""
        return tuple(mx.split(operands[0], 2, axis=attrs.axis))

    @mp.register_op("test_each_doubled", operands=(1, None), outputs=lambda attrs, n: n)
    def each_doubled(operands, attrs):
        """Every operand times two."""
        return tuple(2 * x for x in operands)  # a tuple even when it holds one result

    yield
    for name in ("test_scale", "test_halves", "test_each_doubled"):
        mp.unregister_op(name)


def program(instructions: list[dict], outputs: list[dict]) -> mp.Program:
    return mp.Program.loads(json.dumps({
        "format": "mlxprog", "version": 1,
        "inputs": [{"name": "x", "shape": [2, 4], "dtype": "float32"}],
        "instructions": instructions, "outputs": outputs}))


X = mx.arange(8, dtype=mx.float32).reshape(2, 4)


def test_user_op_is_registered(user_ops):
    spec = mp.lookup("test_scale")
    assert (spec.name, spec.attrs, spec.describe_arity()) == ("test_scale", ScaleAttrs, "1")
    assert spec.family == "test_registry"
    assert spec.doc == "``x * factor + offset``."
    assert "test_scale" in mp.all_ops()
    assert mp.lookup("test_each_doubled").describe_arity() == "1 or more"


def test_user_op_from_json(user_ops):
    prog = program([{"op": "test_scale", "operands": [{"input": 0}],
                     "attrs": {"factor": 3, "offset": -1.5}}], [{"result": 0}])
    (out,) = mp.run(prog, X)
    assert_close(out, X * 3 - 1.5)
    step = mp.validate(prog).block.steps[0]
    assert step.attrs == ScaleAttrs(factor=3.0, offset=-1.5)


def test_user_op_float_attr_accepts_nonfinite_strings(user_ops):
    prog = program([{"op": "test_scale", "operands": [{"input": 0}],
                     "attrs": {"factor": "-inf"}}], [{"result": 0}])
    assert mp.Program.loads(prog.to_json()) == prog
    (out,) = mp.run(prog, mx.ones((2, 4)))
    assert out.tolist() == [[float("-inf")] * 4] * 2


def test_user_op_from_the_builder(user_ops):
    b = mp.ProgramBuilder("user")
    x = b.input("x", (2, 4), "float32")
    y = b.test_scale(b.exp(x), factor=0.5)
    prog = b.build([y])
    assert prog.instructions[1].attrs == {"factor": 0.5}
    (out,) = mp.run(mp.Program.loads(prog.to_json()), X)
    assert_close(out, mx.exp(X) * 0.5)


def test_user_op_attrs_are_validated(user_ops):
    with pytest.raises(mp.ValidationError) as info:
        mp.validate(program([{"op": "test_scale", "operands": [{"input": 0}],
                              "attrs": {"factor": "big"}}], [{"result": 0}]))
    assert str(info.value).startswith("instruction 0 (test_scale): attribute 'factor': ")
    assert "found 'big'" in str(info.value)
    with pytest.raises(mp.ValidationError, match="attribute 'factor': Field required"):
        mp.validate(program([{"op": "test_scale", "operands": [{"input": 0}]}], [{"result": 0}]))
    b = mp.ProgramBuilder()
    x = b.input("x", (2, 4), "float32")
    with pytest.raises(mp.ValidationError, match=r"\(test_halves\): attribute 'axis': axis 2"):
        b.test_halves(x, axis=2)


def test_multi_output_user_op(user_ops):
    prog = program([{"op": "test_halves", "operands": [{"input": 0}], "attrs": {"axis": 1}},
                    {"op": "subtract", "operands": [{"result": 1}, {"result": 0}]}],
                   [{"result": 2}, {"result": 0}])
    validated = mp.validate(prog)
    assert [str(a) for a in validated.block.avals[1:]] == ["float32[2, 2]"] * 3
    for eager in (False, True):
        diff, left = mp.run(prog, X, eager=eager)
        assert_close(diff, mx.full((2, 2), 2.0))
        assert_close(left, X[:, :2])


def test_output_count_from_operand_count(user_ops):
    b = mp.ProgramBuilder()
    x = b.input("x", (2, 4), "float32")
    one = b.test_each_doubled(x)
    three = b.test_each_doubled(x, x, x)
    assert isinstance(one, tuple) and len(one) == 1 and len(three) == 3
    outs = mp.run(b.build([one[0], three[2]]), X)
    for out in outs:
        assert_close(out, 2 * X)


def test_duplicate_registration_is_an_error(user_ops):
    with pytest.raises(RegistryError, match="op 'test_scale' is already registered"):
        mp.register_op("test_scale")
    with pytest.raises(RegistryError, match="op 'exp' is already registered"):
        mp.register_op("exp")
    assert mp.lookup("exp").family == "elementwise"


def test_replace(user_ops):
    @mp.register_op("test_scale", attrs=ScaleAttrs, replace=True)
    def scale_twice(operands, attrs):
        return operands[0] * (2 * attrs.factor)

    assert mp.lookup("test_scale").impl is scale_twice
    b = mp.ProgramBuilder()
    y = b.test_scale(b.input("x", (2, 4), "float32"), factor=3)
    (out,) = mp.run(b.build([y]), X)
    assert_close(out, X * 6)


def test_attrs_must_be_an_attrs_model():
    class Plain:
        factor: float = 1.0

    with pytest.raises(RegistryError, match="attrs must be a subclass of mlxprog.Attrs"):
        mp.register_op("test_plain", attrs=Plain)
    assert mp.lookup("test_plain") is None


def test_unregister(user_ops):
    mp.unregister_op("test_scale")
    assert mp.lookup("test_scale") is None
    with pytest.raises(mp.ValidationError, match=r"unknown op 'test_scale' \(did you mean"):
        mp.validate(program([{"op": "test_scale", "operands": [{"input": 0}]}], []))


@pytest.fixture
def bad_ops():
    @mp.register_op("test_returns_list")
    def returns_list(operands, attrs):
        return [operands[0]]

    @mp.register_op("test_returns_scalar")
    def returns_scalar(operands, attrs):
        return 1.0

    @mp.register_op("test_too_many", outputs=2)
    def too_many(operands, attrs):
        return operands[0], operands[0], operands[0]

    @mp.register_op("test_raises")
    def raises(operands, attrs):
        raise ValueError("operand must be square")

    yield
    for name in ("test_returns_list", "test_returns_scalar", "test_too_many", "test_raises"):
        mp.unregister_op(name)


@pytest.mark.parametrize("op, detail", [
    ("test_returns_list", "implementation returned list; expected one mx.array"),
    ("test_returns_scalar", "implementation returned float; expected one mx.array"),
    ("test_too_many", "op produced 3 result(s), its spec declares 2"),
    ("test_raises", "operand must be square (operands: float32[2, 4])"),
])
def test_bad_implementation_is_a_validation_error(bad_ops, op, detail):
    with pytest.raises(mp.ValidationError) as info:
        mp.validate(program([{"op": "exp", "operands": [{"input": 0}]},
                             {"op": op, "operands": [{"result": 0}]}], []))
    err = info.value
    assert (err.location, err.op) == ("instruction 1", op)
    assert detail in err.detail


class PickAttrs(mp.Attrs):
    axis: Axis = 0
    index: int = 0


def _check_pick(avals, attrs):
    """``index`` must lie in operand 0's ``axis``."""
    if not 0 <= attrs.index < avals[0].shape[attrs.axis]:
        raise mp.CheckError(f"index {attrs.index} is outside axis {attrs.axis} "
                            f"of {avals[0]}", attribute="index")


@pytest.fixture
def checked_op():
    @mp.register_op("test_pick", attrs=PickAttrs, check=_check_pick)
    def pick(operands, attrs):
        """Row ``index`` along ``axis``."""
        return mx.take(operands[0], attrs.index, axis=attrs.axis)

    @mp.register_op("test_sloppy", operands=(1, 2), check=lambda avals, attrs: avals[1])
    def sloppy(operands, attrs):
        """Operand 0 (its check reads an operand that may be absent)."""
        return operands[0]

    yield
    mp.unregister_op("test_pick")
    mp.unregister_op("test_sloppy")


def test_check_rule_sees_resolved_axes_and_names_the_attribute(checked_op):
    prog = program([{"op": "test_pick", "operands": [{"input": 0}],
                     "attrs": {"axis": -1, "index": 3}}], [{"result": 0}])
    assert mp.validate(prog).block.steps[0].attrs == PickAttrs(axis=1, index=3)
    assert_close(mp.run(prog, X)[0], X[:, 3])
    bad = program([{"op": "test_pick", "operands": [{"input": 0}],
                    "attrs": {"axis": -1, "index": 4}}], [{"result": 0}])
    with pytest.raises(mp.ValidationError) as info:
        mp.validate(bad)
    assert str(info.value) == ("instruction 0 (test_pick): attribute 'index': index 4 is "
                               "outside axis 1 of float32[2, 4]")
    far = program([{"op": "test_pick", "operands": [{"input": 0}], "attrs": {"axis": 2}}],
                  [{"result": 0}])
    with pytest.raises(mp.ValidationError, match="attribute 'axis': axis 2 is out of range "
                                                 "for an operand of rank 2"):
        mp.validate(far)


def test_a_failing_check_rule_is_a_validation_error_not_a_crash(checked_op):
    prog = program([{"op": "test_sloppy", "operands": [{"input": 0}]}], [{"result": 0}])
    with pytest.raises(mp.ValidationError, match=r"instruction 0 \(test_sloppy\).*operands: "
                                                 r"float32\[2, 4\]"):
        mp.validate(prog)


def test_attribute_models_validate_without_operands():
    # The docs and the schema validate the same models the op checks use.
    assert PickAttrs.model_validate({"axis": -7}).axis == -7
    with pytest.raises(Exception, match="axes"):
        mp.lookup("sum").attrs.model_validate({"axes": [0, 0]})


def test_one_family_factory_registers_ops_with_their_docs():
    calls = []

    def apply(function, operands, attrs):
        calls.append(function)
        return function(operands[0])

    mp.register_family({"test_neg": (mx.negative, "Negation."), "test_abs": (mx.abs, "|x|.")},
                       apply, shapeless=True)
    try:
        assert mp.lookup("test_neg").doc == "Negation."
        assert mp.lookup("test_abs").family == "test_registry"
        assert mp.lookup("test_abs").shapeless
        prog = program([{"op": "test_neg", "operands": [{"input": 0}]},
                        {"op": "test_abs", "operands": [{"result": 0}]}], [{"result": 1}])
        assert_close(mp.run(prog, X)[0], X)
    finally:
        mp.unregister_op("test_neg")
        mp.unregister_op("test_abs")


def test_an_op_registered_with_context_gets_the_executables():
    seen = []

    @mp.register_op("test_context", context=True)
    def with_context(operands, attrs, context):
        """``x``, recording the context it is given."""
        seen.append(context)
        return operands[0] + 0

    try:
        prog = program([{"op": "test_context", "operands": [{"input": 0}]}], [{"result": 0}])
        mp.validate(prog)
        (validation,) = seen  # validation runs it on placeholders
        assert isinstance(validation, mp.ExecutionContext) and not validation.native.enabled
        for native in (False, True):
            validated = mp.validate(prog)
            seen.clear()
            exe = mp.compile(validated, native=native)
            for _ in range(3):
                assert_close(exe(X)[0], X)
            # Traced once; replays run the traced graph, not the function.
            assert seen == [exe.context] and exe.context.native.enabled is native
            assert exe.context.group is None and exe.context.world_size is None
            seen.clear()
        eager = mp.compile(validated, eager=True)
        seen.clear()
        eager(X)
        eager(X)
        assert seen == [eager.context] * 2
    finally:
        mp.unregister_op("test_context")


def test_a_family_registered_with_context_gets_it():
    seen = []

    def apply(function, operands, attrs, context):
        seen.append(context)
        return function(operands[0])

    mp.register_family({"test_ctx_neg": (mx.negative, "Negation.")}, apply, context=True)
    try:
        assert mp.lookup("test_ctx_neg").context
        prog = program([{"op": "test_ctx_neg", "operands": [{"input": 0}]}], [{"result": 0}])
        exe = mp.compile(prog)
        assert_close(exe(X)[0], -X)
        assert seen[-1] is exe.context
    finally:
        mp.unregister_op("test_ctx_neg")


def test_a_distributed_op_must_take_the_context():
    with pytest.raises(RegistryError, match="register it with context=True"):
        mp.register_op("test_no_context_collective",
                       distributed="collective")(lambda operands, attrs: operands[0])
    assert mp.lookup("test_no_context_collective") is None
