"""Host-boundary ops: ``while``, ``cond`` and ``runtime_call``.

``mx.compile`` cannot run Python or branch on data, so these ops end a compiled
segment (see :mod:`mlxprog.executable`). Their implementations are *host
handlers* with the signature ``handler(runner, step, operands, inputs)``: they
run on the host between segments, driving the compiled sub-runners of their
subprograms or calling back into Python.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

from .attrs import Attrs, DType, PositiveInt, Size
from .dtypes import name_of, numpy_dtype, to_mlx
from .errors import CallbackError, LoopLimitError, ValidationError
from .registry import AVal, register_op
from .validate import Base, Block, validate_block

# -- while -------------------------------------------------------------------


class WhileAttrs(Attrs):
    max_iterations: PositiveInt | None = None


def _validate_while(base: Base, inst, avals: list[AVal], attrs, where: str):
    cond = _sub_block(base, inst, "cond", avals, where)
    body = _sub_block(base, inst, "body", avals, where)
    _check_predicate(cond, f"{where} > cond")
    _check_same(body.out_avals, avals, f"{where} > body", "the carry")
    return {"cond": cond, "body": body}, list(avals)


def _run_while(runner, step, operands: list[mx.array], inputs: Sequence[mx.array]):
    """Loop while ``cond`` is true: operands are the initial carry; ``cond``
    maps the carry to one boolean scalar, ``body`` maps it to a new carry of the
    same shapes and dtypes; the results are the final carry. Both subprograms see
    the program's inputs, captures and constants. ``max_iterations`` (default: the
    Executable's limit) ends a runaway loop with ``LoopLimitError``."""
    cond, body = runner.children[step]["cond"], runner.children[step]["body"]
    fused = None if runner.options.eager else runner.fused_iteration(step)
    limit = step.attrs.max_iterations or runner.options.max_iterations
    carry = operands
    pred = cond.run(inputs, carry)[0]
    iterations = 0
    while pred.item():
        if iterations == limit:
            raise LoopLimitError(
                f"{step.location} (while): loop did not finish within "
                f"max_iterations={limit}"
            )
        if fused is not None:
            *carry, pred = fused([*inputs, *carry], runner.stats)
        else:
            carry = body.run(inputs, carry)
            pred = cond.run(inputs, carry)[0]
        # Evaluating carry and predicate together keeps the graph one
        # iteration deep and costs a single synchronisation per iteration.
        mx.eval(pred, *carry)
        iterations += 1
    runner.stats.loop_iterations += iterations
    return carry


register_op(
    "while",
    attrs=WhileAttrs,
    operands=(0, None),
    outputs=lambda attrs, n: n,
    subprograms=("cond", "body"),
    host=True,
    family="control",
    validate_structured=_validate_while,
)(_run_while)


# -- cond --------------------------------------------------------------------


def _validate_cond(base: Base, inst, avals: list[AVal], attrs, where: str):
    pred = avals[0]
    if pred.shape != () or not (pred.dtype == mx.bool_ or mx.issubdtype(pred.dtype, mx.integer)):
        raise ValidationError(
            f"operand 0 (the predicate) must be a bool or integer scalar, found {pred}",
            where, inst.op,
        )
    then = _sub_block(base, inst, "then", avals[1:], where)
    other = _sub_block(base, inst, "else", avals[1:], where)
    _check_same(other.out_avals, then.out_avals, f"{where} > else", "the 'then' outputs")
    return {"then": then, "else": other}, then.out_avals


def _run_cond(runner, step, operands: list[mx.array], inputs: Sequence[mx.array]):
    """Run ``then`` if operand 0 (a bool or integer scalar) is true/nonzero,
    else ``else``. The remaining operands are passed to the branch as carry; both
    branches must produce outputs of identical shapes and dtypes. Only the taken
    branch runs."""
    branch = "then" if operands[0].item() else "else"
    return runner.children[step][branch].run(inputs, operands[1:])


register_op(
    "cond",
    operands=(1, None),
    outputs=None,
    subprograms=("then", "else"),
    host=True,
    family="control",
    validate_structured=_validate_cond,
)(_run_cond)


# -- runtime_call ------------------------------------------------------------


class OutputSpec(Attrs):
    shape: list[Size]
    dtype: DType


class RuntimeCallAttrs(Attrs):
    callback: str
    outputs: list[OutputSpec] = []

    @cached_property
    def output_avals(self) -> list[AVal]:
        """The declared outputs as avals (computed once; checked on every call)."""
        return [AVal(tuple(o.shape), to_mlx(o.dtype)) for o in self.outputs]


def _runtime_call_shapes(avals: list[AVal], attrs: RuntimeCallAttrs) -> list[AVal]:
    return attrs.output_avals


def _run_runtime_call(runner, step, operands: list[mx.array], inputs: Sequence[mx.array]):
    """Call the Python function registered under ``callback`` in the
    ``callbacks`` mapping given to ``mlxprog.compile`` (a program can never name
    importable code). It receives the operand arrays and must return arrays of the
    declared ``outputs`` shapes and dtypes (checked). It fires on every call of the
    Executable, in program order, even when nobody uses its results."""
    name = step.attrs.callback
    callback = runner.options.callbacks[name]
    where = f"{step.location} (runtime_call {name!r})"
    try:
        returned = callback(*operands)
    except Exception as exc:
        raise CallbackError(f"{where}: callback raised {type(exc).__name__}: {exc}") from exc
    runner.stats.callback_calls += 1
    return _check_callback_results(returned, step.attrs.output_avals, where)


def _check_callback_results(returned: Any, declared: list[AVal], where: str) -> list:
    if returned is None:
        returned = []
    elif not isinstance(returned, (list, tuple)):
        returned = [returned]
    if len(returned) != len(declared):
        raise CallbackError(
            f"{where}: callback returned {len(returned)} value(s), declared {len(declared)}"
        )
    results = []
    for k, (value, (shape, dtype)) in enumerate(zip(returned, declared)):
        if isinstance(value, np.ndarray) and value.dtype != numpy_dtype(dtype):
            raise CallbackError(
                f"{where}: output {k} has dtype {value.dtype}, declared {name_of(dtype)}"
            )
        if not isinstance(value, mx.array):
            try:
                value = mx.array(value, dtype=dtype)
            except (TypeError, ValueError) as exc:
                raise CallbackError(f"{where}: output {k} is not array-like: {exc}") from None
        if value.shape != shape or value.dtype != dtype:
            raise CallbackError(
                f"{where}: output {k} is {name_of(value.dtype)}{list(value.shape)}, "
                f"declared {name_of(dtype)}{list(shape)}"
            )
        results.append(value)
    return results


register_op(
    "runtime_call",
    attrs=RuntimeCallAttrs,
    operands=(0, None),
    outputs=lambda attrs, n: len(attrs.outputs),
    shape_rule=_runtime_call_shapes,
    host=True,
    family="control",
)(_run_runtime_call)


# -- shared checks -----------------------------------------------------------


def _sub_block(base: Base, inst, name: str, carry: Sequence[AVal], where: str) -> Block:
    sub = inst.subprograms[name]
    return validate_block(base, sub.instructions, sub.outputs, list(carry), f"{where} > {name}")


def _check_predicate(block: Block, where: str) -> None:
    outs = block.out_avals
    if len(outs) != 1 or outs[0].shape != () or outs[0].dtype != mx.bool_:
        found = ", ".join(str(a) for a in outs) or "no outputs"
        raise ValidationError(f"must output one bool scalar, found {found}", where)


def _check_same(found: list[AVal], expected: list[AVal], where: str, what: str) -> None:
    if len(found) != len(expected):
        raise ValidationError(
            f"outputs {len(found)} value(s), but {what} has {len(expected)}", where
        )
    for k, (f, e) in enumerate(zip(found, expected)):
        if f != e:
            raise ValidationError(f"output {k} is {f}, but {what} has {e} there", where)
