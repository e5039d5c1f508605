"""The host-op interface: a user-defined host op (the example of
docs/contributing.md) validates, plans, runs compiled and eager, and the
runtime needs nothing op-specific for it."""

from __future__ import annotations

import numpy as np
import pytest

import mlxprog as mp
from mlxprog.ops.attrs import PositiveInt
from mlxprog.ops.control.checks import check_same
from mlxprog.runtime.plan import describe


class RepeatAttrs(mp.Attrs):
    times: PositiveInt


class Repeat(mp.HostOp):
    """Run ``body`` ``times`` times on the carry (the operands)."""

    def infer(self, subprograms, avals, attrs):
        check_same(subprograms.check("body", avals).out_avals, avals, "body", "the carry")
        return list(avals)

    def check_options(self, step, options):
        if options.max_iterations < step.attrs.times:
            raise mp.BindingError(f"{step.location}: repeats more than max_iterations")

    def prepare(self, step, env):
        body = env.runner(step.blocks["body"])
        times = step.attrs.times

        def run(operands, inputs, context):
            for _ in range(times):
                operands = body.run(inputs, operands, context)
            return operands

        return run


@pytest.fixture
def repeat_op():
    mp.register_host_op("test_repeat", Repeat(), attrs=RepeatAttrs, operands=(0, None),
                        outputs=lambda attrs, n: n, subprograms=("body",))
    yield
    mp.unregister_op("test_repeat")


def repeat_program(body_outputs: str = '[{"result": 0}]') -> mp.Program:
    return mp.Program.loads('''{"format": "mlxprog", "version": 1,
      "inputs": [{"name": "x", "shape": [3], "dtype": "float32"}],
      "constants": [{"value": 2.0, "dtype": "float32"}],
      "instructions": [{"op": "test_repeat", "operands": [{"input": 0}], "attrs": {"times": 3},
        "subprograms": {"body": {"instructions": [
          {"op": "multiply", "operands": [{"carry": 0}, {"const": 0}]}],
          "outputs": %s}}}],
      "outputs": [{"result": 0}]}''' % body_outputs)


@pytest.mark.parametrize("eager", [False, True])
def test_a_user_host_op_runs_compiled_and_eager(repeat_op, eager):
    exe = mp.compile(repeat_program(), eager=eager)
    out = exe(np.array([1.0, 2.0, 3.0], np.float32))[0]
    np.testing.assert_allclose(np.array(out), [8.0, 16.0, 24.0])
    assert mp.lookup("test_repeat").doc.startswith("Run ``body``")


def test_its_rules_report_where(repeat_op):
    with pytest.raises(mp.ValidationError, match=r"instruction 0 > body: outputs 0 value"):
        mp.validate(repeat_program("[]"))
    with pytest.raises(mp.BindingError, match="instruction 0: repeats more than"):
        mp.compile(repeat_program(), max_iterations=2)


def test_its_plan_nests_the_subprogram(repeat_op):
    validated = mp.validate(repeat_program())
    assert describe(validated.block, 1) == [
        "host: instruction 0 (test_repeat)",
        "  segment: instruction 0 > body > instruction 0 (1 op(s), compiled)",
    ]


def test_a_host_op_must_be_a_host_op():
    with pytest.raises(mp.ops.registry.RegistryError, match="must be a mlxprog.ops.host.HostOp"):
        mp.register_host_op("test_not_host", object())
    assert mp.lookup("test_not_host") is None
