"""The interpreter: runs validated steps over an environment list.

A step reads its operands from environment slots and writes its results to the
slots after them (see :mod:`mlxprog.validate.steps` for the layout). The same loop is
traced by ``mx.compile`` (compiled mode) and run directly (eager mode); the
ops that take an :class:`~mlxprog.ops.context.ExecutionContext` get the one
it is given.
"""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx

from ..arrays import is_floating
from ..errors import EvaluationError, NumericError
from ..ops.context import ExecutionContext
from ..validate.steps import Step


def run_steps(steps: Sequence[Step], env: list, context: ExecutionContext) -> None:
    """Apply each step to ``env`` in order, writing results into their slots
    (the ops registered with ``context=True`` get ``context``).

    Steps that talk to other ranks are chained (each one's operands depend on
    the previous one's result): MLX evaluates a graph in an order of its own,
    and ranks must communicate in program order or wait for each other
    forever."""
    previous = None  # the result of the last step that talked to other ranks
    for step in steps:
        operands = [env[i] for i in step.args]
        talks = step.spec.distributed in _TALKS
        if talks and previous is not None and operands:
            operands = mx.depends(operands, [previous])
        result = step.spec.apply(operands, step.attrs, context)
        if talks:
            previous = result[0] if step.unpack else result
        if step.unpack:
            env[step.out : step.out + step.n_out] = result
        else:
            env[step.out] = result


_TALKS = ("collective", "point_to_point")


def run_step_eager(step: Step, env: list, release: Sequence[int], check_numerics: bool,
                   context: ExecutionContext) -> None:
    """Run one step, evaluate its results, optionally check them for NaN/Inf,
    then drop the values whose last use was this step."""
    run_steps((step,), env, context)
    results = env[step.out : step.out + step.n_out]
    try:
        mx.eval(results)
    except (RuntimeError, ValueError) as exc:  # MLX's error for values it cannot compute
        raise EvaluationError(f"{step.location} ({step.spec.name}) failed while computing its "
                              f"results: {exc}") from exc
    if check_numerics:
        check_finite(step, results)
    for slot in release:
        env[slot] = None


def check_finite(step: Step, results: Sequence[mx.array]) -> None:
    """Raise :class:`NumericError` if a floating result holds a NaN or an Inf."""
    for k, value in enumerate(results):
        if not is_floating(value.dtype) or value.size == 0:
            continue
        n_nan = mx.isnan(value).sum().item()
        n_inf = mx.isinf(value).sum().item()
        if n_nan or n_inf:
            which = f"result {k} of " if step.n_out > 1 else ""
            raise NumericError(
                f"{which}{step.location} ({step.spec.name}) produced "
                f"{n_nan} NaN and {n_inf} Inf value(s) in an array of shape {list(value.shape)}"
            )
