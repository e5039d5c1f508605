"""``cond``: runs one of its ``then`` and ``else`` subprograms."""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx

from ..attrs import CheckError
from ..context import ExecutionContext
from ..host import BlockRun, HostEnv, HostOp, Subprograms
from ..registry import register_host_op
from .checks import check_same


class Cond(HostOp):
    """Run ``then`` if operand 0 (a bool or integer scalar) is true/nonzero,
    else ``else``. The remaining operands are passed to the branch as carry; both
    branches must produce outputs of identical shapes and dtypes. Only the taken
    branch runs."""

    def infer(self, subprograms: Subprograms, avals, attrs):
        """The branches' output avals, which must agree."""
        pred = avals[0]
        if pred.shape != () or not (pred.dtype == mx.bool_
                                    or mx.issubdtype(pred.dtype, mx.integer)):
            raise CheckError(
                f"operand 0 (the predicate) must be a bool or integer scalar, found {pred}")
        then = subprograms.check("then", avals[1:]).out_avals
        check_same(subprograms.check("else", avals[1:]).out_avals, then, "else",
                   "the 'then' outputs")
        return then

    def prepare(self, step, env: HostEnv) -> _Branch:
        """Runners of both branches."""
        return _Branch(env.runner(step.blocks["then"]), env.runner(step.blocks["else"]))


class _Branch:
    """One ``cond`` step, ready to run."""

    def __init__(self, then: BlockRun, other: BlockRun):
        self.then, self.other = then, other

    def __call__(self, operands: list[mx.array], inputs: Sequence[mx.array],
                 context: ExecutionContext) -> list[mx.array]:
        branch = self.then if operands[0].item() else self.other
        return branch.run(inputs, operands[1:], context)


register_host_op("cond", Cond(), operands=(1, None), outputs=None,
                 subprograms=("then", "else"))
