"""``runtime_call``: a call into a Python function named by the program."""

from __future__ import annotations

from functools import cached_property
from typing import Any, Sequence

import mlx.core as mx

from ...arrays import AVal, to_mlx
from ...errors import CallbackError, UnboundError
from ...runtime.binding import Mismatch, to_array
from ..attrs import Attrs, DType, Size
from ..context import ExecutionContext
from ..host import HostEnv, HostOp, HostOptions
from ..registry import register_host_op


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


class RuntimeCall(HostOp):
    """Call the Python function registered under ``callback`` in the
    ``callbacks`` mapping given to ``mlxprog.compile`` (a program can never name
    importable code). It receives the operand arrays and must return arrays of the
    declared ``outputs`` shapes and dtypes (checked). It fires on every call of the
    Executable, in program order, even when nobody uses its results; a call
    made through ``exe.with_callbacks(...)`` calls the functions given there."""

    def infer(self, subprograms, avals, attrs: RuntimeCallAttrs) -> list[AVal]:
        """The declared outputs."""
        return attrs.output_avals

    def check_options(self, step, options: HostOptions) -> None:
        """The callback must be among those given to ``compile``."""
        name = step.attrs.callback
        if not callable(options.callbacks.get(name)):
            given = ", ".join(sorted(options.callbacks)) or "none"
            raise UnboundError(
                "callback", name, f"{step.location} (runtime_call) names callback {name!r}, "
                f"which was not given (given: {given})", "pass it in compile's callbacks="
            )

    def prepare(self, step, env: HostEnv) -> _Call:
        """The callback's name, with where to blame its failures."""
        name = step.attrs.callback
        return _Call(name, step.attrs.output_avals, f"{step.location} (runtime_call {name!r})",
                     env.stats)


class _Call:
    """One ``runtime_call`` step, ready to run: its callback is looked up in
    the context of each call (the same executable may stream each caller's
    results to a callback of its own)."""

    def __init__(self, name: str, declared: list[AVal], where: str, stats):
        self.name, self.declared, self.where, self.stats = name, declared, where, stats

    def __call__(self, operands: list[mx.array], inputs: Sequence[mx.array],
                 context: ExecutionContext) -> list[mx.array]:
        callback = context.callbacks[self.name]  # compile checked that it was given
        try:
            returned = callback(*operands)
        except Exception as exc:
            raise CallbackError(f"{self.where}: callback raised {type(exc).__name__}: "
                                f"{exc}") from exc
        self.stats.callback_calls += 1
        return self._results(returned)

    def _results(self, returned: Any) -> list[mx.array]:
        if returned is None:
            returned = []
        elif not isinstance(returned, (list, tuple)):
            returned = [returned]
        if len(returned) != len(self.declared):
            raise CallbackError(f"{self.where}: callback returned {len(returned)} value(s), "
                                f"declared {len(self.declared)}")
        results = []
        for k, (value, aval) in enumerate(zip(returned, self.declared)):
            try:
                results.append(to_array(value, aval.dtype, aval.shape))
            except Mismatch as bad:
                if bad.reason:
                    raise CallbackError(f"{self.where}: output {k} is not array-like: "
                                        f"{bad.reason}") from None
                raise CallbackError(f"{self.where}: output {k} is {bad.found}, "
                                    f"declared {bad.expected}") from None
        return results


register_host_op("runtime_call", RuntimeCall(), attrs=RuntimeCallAttrs, operands=(0, None),
                 outputs=lambda attrs, n: len(attrs.outputs))
