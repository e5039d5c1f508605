"""``while``: a loop that owns its ``cond`` and ``body`` subprograms."""

from __future__ import annotations

import time
from typing import Sequence

import mlx.core as mx

from ...errors import LoopLimitError
from ..attrs import Attrs, PositiveInt
from ..context import ExecutionContext
from ..host import BlockRun, HostEnv, HostOp, Subprograms
from ..registry import register_host_op
from .checks import check_predicate, check_same


class WhileAttrs(Attrs):
    max_iterations: PositiveInt | None = None
    """Iterations after which the loop fails with ``LoopLimitError``; the
    Executable's ``max_iterations`` applies when it is smaller (or this is null)."""


class While(HostOp):
    """Loop while ``cond`` is true: operands are the initial carry; ``cond``
    maps the carry to one boolean scalar, ``body`` maps it to a new carry of the
    same shapes and dtypes; the results are the final carry. Both subprograms see
    the program's inputs, captures and constants. A runaway loop ends with
    ``LoopLimitError`` after ``max_iterations`` iterations or the Executable's
    limit, whichever is smaller (a program can lower the caller's limit, never
    raise it), or once it has run for ``Limits.max_loop_seconds``."""

    def infer(self, subprograms: Subprograms, avals, attrs):
        """The carry's avals; ``cond`` must give a bool scalar, ``body`` the carry."""
        check_predicate(subprograms.check("cond", avals).out_avals, "cond")
        check_same(subprograms.check("body", avals).out_avals, avals, "body", "the carry")
        return list(avals)

    def prepare(self, step, env: HostEnv) -> _Loop:
        """Runners of both subprograms and, when each is a single compiled
        segment, one compiled function running an iteration (body, then cond
        on the new carry), so an iteration is one compiled call."""
        cond, body = env.runner(step.blocks["cond"]), env.runner(step.blocks["body"])
        fused = None if env.options.eager else _fuse(step, env, cond, body)
        limit = min(step.attrs.max_iterations or env.options.max_iterations,
                    env.options.max_iterations)
        return _Loop(step.location, cond, body, fused, limit, env.options.max_loop_seconds,
                     env.stats)


def _fuse(step, env: HostEnv, cond: BlockRun, body: BlockRun):
    body_fn, cond_fn = body.function(), cond.function()
    if body_fn is None or cond_fn is None:
        return None
    n_inputs = env.n_inputs

    def iterate(*values):
        inputs, carry = values[:n_inputs], values[n_inputs:]
        new_carry = body_fn(inputs, carry)
        return [*new_carry, cond_fn(inputs, new_carry)[0]]

    instructions = step.blocks["body"].instruction_count() + step.blocks["cond"].instruction_count()
    return env.compile(iterate, f"{step.location} > body + cond", instructions)


class _Loop:
    """One ``while`` step, ready to run."""

    def __init__(self, location: str, cond: BlockRun, body: BlockRun, fused, limit: int,
                 seconds: float, stats):
        self.location = location
        self.cond, self.body, self.fused = cond, body, fused
        self.limit, self.seconds = limit, seconds
        self.stats = stats

    def __call__(self, operands: list[mx.array], inputs: Sequence[mx.array],
                 context: ExecutionContext) -> list[mx.array]:
        carry = operands
        # Every iteration ends in a synchronisation (`pred.item()`), so the
        # clock read after it covers the work done so far, compiled or not;
        # reading it costs far less than the synchronisation.
        deadline = time.monotonic() + self.seconds
        pred = self.cond.run(inputs, carry, context)[0]
        iterations = 0
        while pred.item():
            if iterations == self.limit:
                raise LoopLimitError(f"{self.location} (while): loop did not finish within "
                                     f"max_iterations={self.limit}")
            if time.monotonic() > deadline:
                raise LoopLimitError(f"{self.location} (while): loop did not finish within "
                                     f"{self.seconds:g} s (Limits.max_loop_seconds; "
                                     f"{iterations:,} iterations run)")
            if self.fused is not None:
                *carry, pred = self.fused([*inputs, *carry])
            else:
                carry = self.body.run(inputs, carry, context)
                pred = self.cond.run(inputs, carry, context)[0]
            # Evaluating carry and predicate together keeps the graph one
            # iteration deep and costs a single synchronisation per iteration.
            mx.eval(pred, *carry)
            iterations += 1
        self.stats.loop_iterations += iterations
        return carry


register_host_op("while", While(), attrs=WhileAttrs, operands=(0, None),
                 outputs=lambda attrs, n: n, subprograms=("cond", "body"))
