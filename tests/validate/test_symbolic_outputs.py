"""Output shapes of symbolic programs described in their dims, when the dims
bound one another without saying so (a prompt length T that must fit in the
cache length S)."""

from __future__ import annotations

import pytest

import mlxprog as mp
from helpers import prefill_like


@pytest.mark.parametrize("order", ["BTS", "BST", "STB"])
def test_outputs_are_described_in_dims_that_bound_one_another(order):
    # Before, the generic samples (S=11, T=13 in sorted order) broke T <= S,
    # only the all-ones binding validated, and its sizes were shown as
    # constants: int32[1], float32[1, 3, 1, 64].
    described = mp.validate(prefill_like(order)).describe_outputs()
    assert described == ["int32[B]", "float32[B, 3, S, 64]"]


def test_generic_samples_are_used_for_the_plan():
    sample = mp.validate(prefill_like()).sample
    assert 1 not in sample.input_avals[0].shape


def test_an_axis_the_samples_cannot_tell_from_a_constant_is_unknown():
    # A <= B and C <= B: no order of growing values satisfies both, so only
    # the all-minimum binding validates, where B's size 1 could be a constant.
    program = mp.Program.from_dict({
        "format": "mlxprog", "version": 1,
        "dims": {name: {"min": 1, "max": 64} for name in "ABC"},
        "inputs": [{"name": n.lower(), "shape": [n], "dtype": "float32"} for n in "ABC"],
        "instructions": [{"op": "put_slice", "operands": [{"input": 1}, {"input": 0}]},
                         {"op": "put_slice", "operands": [{"result": 0}, {"input": 2}]},
                         {"op": "sum", "operands": [{"input": 0}], "attrs": {"axes": [0]}}],
        "outputs": [{"result": 1}, {"result": 2}],
    })
    described = mp.validate(program).describe_outputs()
    assert described == ["float32[?]", "float32[]"]
