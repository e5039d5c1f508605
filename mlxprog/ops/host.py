"""The host-op interface: ops that run Python between compiled segments.

``mx.compile`` cannot run Python or branch on data, so control flow
(``while``, ``cond``) and callbacks (``runtime_call``) end a compiled segment
and run on the host. Such an op is an ordinary registered op whose spec
carries a :class:`HostOp`: an object with the op's rules for each stage of
the pipeline, each typed here.

- validate: :meth:`HostOp.infer` gives the result avals, validating the op's
  subprograms through :class:`Subprograms`;
- compile: :meth:`HostOp.check_options` checks the options an Executable is
  built with (a callback named by the program must be given);
- run: :meth:`HostOp.prepare` is called once per step when a block's plan is
  turned into a runner, with a :class:`HostEnv`; it builds what the op needs
  (runners of its subprograms, a fused loop iteration) and returns the
  :data:`HostCall` that runs the step. Each call of it is given the
  :class:`~mlxprog.ops.context.ExecutionContext` of that call of the
  Executable, which it hands to the subprograms it runs; a
  ``runtime_call`` finds its callback there.

The runtime never looks at an op's name or its subprograms' names: everything
specific to an op lives in its module under :mod:`mlxprog.ops.control`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, Sequence

import mlx.core as mx

from ..arrays import AVal
from .context import ExecutionContext

HostCall = Callable[[list[mx.array], Sequence[mx.array], ExecutionContext], list[mx.array]]
"""``call(operands, program_inputs, context) -> results``: one run of a host
step, in the context of this call of the Executable."""


class ValidatedBlock(Protocol):
    """What a host op sees of a validated subprogram."""

    @property
    def out_avals(self) -> list[AVal]: ...


class Subprograms(Protocol):
    """Validates the subprograms of the instruction being validated."""

    def check(self, name: str, carry: Sequence[AVal]) -> ValidatedBlock:
        """Validate subprogram ``name`` with carry values of these avals."""


class BlockRun(Protocol):
    """A runner of one subprogram, built by :meth:`HostEnv.runner`."""

    def run(self, inputs: Sequence[mx.array], carry: Sequence[mx.array],
            context: ExecutionContext) -> list[mx.array]:
        """Run the subprogram: program inputs and carry in, its outputs out
        (``context``: the one the host step was called with)."""

    def function(self) -> Callable[[Sequence[mx.array], Sequence[mx.array]], list[mx.array]] | None:
        """The subprogram as one traceable function ``(inputs, carry) -> outputs``
        when it is a single compiled segment (else None)."""


class HostOptions(Protocol):
    """The Executable options a host op reads."""

    eager: bool
    max_iterations: int
    callbacks: Mapping[str, Callable]


class HostCounters(Protocol):
    """The Executable stats a host op counts into."""

    loop_iterations: int
    callback_calls: int


class HostEnv(Protocol):
    """What the runtime gives a host op when its step is prepared."""

    options: HostOptions
    stats: HostCounters
    n_inputs: int

    def runner(self, block: Any) -> BlockRun:
        """A runner of one of the step's subprogram blocks."""

    def compile(self, fn: Callable[..., list[mx.array]], label: str,
                instructions: int) -> Callable[[Sequence[mx.array]], list[mx.array]]:
        """``fn`` (a function of arrays) under its own ``mx.compile``, counted
        in the Executable's stats as a segment named ``label``."""


class HostOp:
    """The rules of an op that runs on the host (see the module docstring).

    Subclasses define :meth:`infer` and :meth:`prepare`; the class docstring
    is the op's entry in the op reference.
    """

    def infer(self, subprograms: Subprograms, avals: list[AVal], attrs: Any) -> list[AVal]:
        """The result avals of an instruction with operands ``avals``; raise
        :class:`~mlxprog.ops.attrs.CheckError` for a bad operand or subprogram."""
        raise NotImplementedError

    def check_options(self, step: Any, options: HostOptions) -> None:
        """Raise :class:`~mlxprog.errors.BindingError` when ``options`` cannot
        run ``step`` (called by ``mlxprog.compile``)."""

    def prepare(self, step: Any, env: HostEnv) -> HostCall:
        """The function that runs ``step`` (called once per runner)."""
        raise NotImplementedError
