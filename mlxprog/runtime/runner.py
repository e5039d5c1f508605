"""The runner: one validated block, its plan turned into compiled segments
and prepared host steps, run in order.

A runner's environment is one flat list per call, ``[inputs | captures |
constants | carry | results]``; ``fixed`` is its prefix (``None`` for each
input, filled per call, then the captures and constants), shared by the
runners of subprograms. Host steps are prepared once, when the runner is
built, by their op (see :mod:`mlxprog.ops.host`): the runner knows no op by
name.

Compiled segments trace their steps with the executable's
:class:`~mlxprog.ops.context.ExecutionContext` (``RunContext.execution``),
fixed when they are built; :meth:`BlockRunner.run` is given the context of
each call, which the host steps (a ``runtime_call``'s callbacks) and eager
steps use.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import mlx.core as mx

from ..format.paths import StepPath
from ..ops.context import ExecutionContext
from ..ops.host import HostCall
from ..validate.steps import Block, Step
from .interpreter import run_step_eager, run_steps
from .options import Options, Stats
from .plan import Plan, SegmentPlan, plan_block
from .segment import Segment


@dataclass
class RunContext:
    """What every runner of an Executable shares: its options and stats, the
    execution context its compiled segments trace their ops with, and for a
    symbolic program the paths of dim-dependent steps and the shapeless
    segments every binding reuses (keyed by their first and last step paths)."""

    options: Options
    stats: Stats
    execution: ExecutionContext
    dim_dependent: frozenset[StepPath] | None = None
    shared: dict[tuple, Segment] | None = None


class ValueSource(enum.IntEnum):
    """Where a single-segment block finds a value without an environment list
    (the position of that sequence in a call's list of sources)."""

    INPUT = 0
    FIXED = 1
    CARRY = 2
    SEGMENT = 3


class BlockRunner:
    """Runs one validated block (the program body or a subprogram)."""

    def __init__(self, block: Block, n_inputs: int, fixed: Sequence[Any], context: RunContext):
        self.block = block
        self.n_inputs = n_inputs
        self.fixed = list(fixed)
        self.context = context
        self.options = context.options
        self.stats = context.stats
        # The segments this runner and its subprograms' runners use.
        self.segments: list[Segment] = []
        self.plan: Plan = plan_block(block, n_inputs, context.dim_dependent)
        env = _HostEnv(self)
        self.host_calls: dict[Step, HostCall] = {
            step: step.spec.host.prepare(step, env) for step in block.steps
            if step.spec.host is not None
        }
        self.units: list[Segment | Step] = [] if self.options.eager else [
            self._segment(unit) if isinstance(unit, SegmentPlan) else unit.step
            for unit in self.plan.units
        ]
        self._direct = self._direct_sources() if self.plan.single_segment \
            and not self.options.eager else None
        self._results = [None] * (block.n_slots - block.n_prefix - block.n_carry)

    def _segment(self, unit: SegmentPlan) -> Segment:
        shared = self.context.shared
        if shared is not None and unit.shapeless:
            if unit.key not in shared:
                shared[unit.key] = self._compile_steps(unit, shapeless=True)
            segment = shared[unit.key]
        else:
            # Without a shared cache (a static program, or a binding MLX cannot
            # trace shapeless) a segment serves one binding.
            segment = self._compile_steps(unit, shapeless=False)
        self.segments.append(segment)
        return segment

    def _compile_steps(self, unit: SegmentPlan, shapeless: bool) -> Segment:
        """The interpreter of a segment's steps over this runner's environment layout."""
        fixed, n_slots = self.fixed, self.block.n_slots
        padding = [None] * (n_slots - len(fixed))
        steps, reads, writes = unit.steps, unit.reads, unit.writes
        # Ops read the context only while the segment is traced (a replay
        # runs the traced graph), so it is the executable's, fixed.
        execution = self.context.execution

        def interpret(*values):
            env = [*fixed, *padding]
            for slot, value in zip(reads, values):
                env[slot] = value
            run_steps(steps, env, execution)
            return [env[s] for s in writes]

        return Segment(interpret, unit.label, len(steps), fixed, self.options.fallback,
                       self.stats, shapeless, reads, writes, unit.sync)

    def _direct_sources(self) -> tuple:
        """For a block of at most one segment: the segment, where its reads
        come from and where the block's outputs are, each a
        ``(ValueSource, index)`` pair, so a call needs no environment list."""
        segment = self.units[0] if self.units else None
        writes = segment.writes if segment else ()
        n_in, n_prefix, n_carry = self.n_inputs, self.block.n_prefix, self.block.n_carry

        def source(slot: int) -> tuple[ValueSource, int]:
            if slot < n_in:
                return ValueSource.INPUT, slot
            if slot < n_prefix:
                return ValueSource.FIXED, slot
            if slot < n_prefix + n_carry:
                return ValueSource.CARRY, slot - n_prefix
            return ValueSource.SEGMENT, writes.index(slot)

        reads = [source(s) for s in segment.reads] if segment else []
        return (segment, reads, [source(s) for s in self.block.outputs],
                [source(s) for s in self.plan.kept])

    def function(self) -> Callable[[Sequence[mx.array], Sequence[mx.array]], list] | None:
        """The block as one uncompiled function ``(inputs, carry) -> outputs``,
        when it is at most one segment (else None): a host op compiles it into
        a larger function (a fused loop iteration)."""
        if self._direct is None:
            return None
        segment = self._direct[0]
        interpret = None if segment is None else (lambda values: segment.interpret(*values))
        return lambda inputs, carry: self._run_direct(interpret, inputs, carry)

    def _run_direct(self, call: Callable | None, inputs: Sequence[mx.array],
                    carry: Sequence[mx.array]) -> list[mx.array]:
        """A block of at most one segment, run by calling ``call`` (the
        compiled segment, or its interpreter) on the list of values it reads."""
        _, reads, outputs, kept = self._direct
        sources = [inputs, self.fixed, carry, ()]  # in ValueSource order
        if call is not None:
            sources[ValueSource.SEGMENT] = call([sources[k][i] for k, i in reads])
        results = [sources[k][i] for k, i in outputs]
        return _tie(results, [sources[k][i] for k, i in kept]) if kept else results

    def run(self, inputs: Sequence[mx.array], carry: Sequence[mx.array],
            context: ExecutionContext) -> list[mx.array]:
        """Run the block on the program inputs and (for subprograms) the
        carry, in the context of this call (see the module docstring)."""
        if self._direct is not None:
            return self._run_direct(self._direct[0], inputs, carry)
        env = [*inputs, *self.fixed[self.n_inputs:], *carry, *self._results]
        if self.options.eager:
            self._run_eager(env, context)
        else:
            for unit in self.units:
                if type(unit) is Segment:
                    if unit.sync:
                        # Earlier communication first (see plan._waits).
                        mx.eval([v for v in env[self.block.n_prefix:] if v is not None])
                    out = unit([env[s] for s in unit.reads])
                    for slot, value in zip(unit.writes, out):
                        env[slot] = value
                else:
                    self._run_host(unit, env, context)
            if self.plan.kept:
                return _tie([env[s] for s in self.block.outputs],
                            [env[s] for s in self.plan.kept])
        return [env[s] for s in self.block.outputs]

    def _run_eager(self, env: list, context: ExecutionContext) -> None:
        check = self.options.check_numerics
        for step, release in zip(self.block.steps, self.plan.release):
            if step.spec.host is not None:
                self._run_host(step, env, context)
                for slot in release:
                    env[slot] = None
            else:
                run_step_eager(step, env, release, check, context)

    def _run_host(self, step: Step, env: list, context: ExecutionContext) -> None:
        results = self.host_calls[step]([env[i] for i in step.args], env[: self.n_inputs],
                                        context)
        env[step.out : step.out + step.n_out] = results


def _tie(outputs: list[mx.array], kept: list[mx.array]) -> list[mx.array]:
    """The outputs made to depend on ``kept`` (results that must be computed
    though nothing reads them: MLX computes only what an output needs); a
    block without outputs computes them now."""
    if outputs:
        return list(mx.depends(outputs, kept))
    mx.eval(kept)
    return outputs


class _HostEnv:
    """The :class:`~mlxprog.ops.host.HostEnv` a runner gives its host steps."""

    def __init__(self, runner: BlockRunner):
        self._runner = runner
        self.options = runner.options
        self.stats = runner.stats
        self.n_inputs = runner.n_inputs

    def runner(self, block: Block) -> BlockRunner:
        """A runner of a subprogram block, sharing captures, options and stats."""
        parent = self._runner
        child = BlockRunner(block, parent.n_inputs, parent.fixed, parent.context)
        parent.segments.extend(child.segments)
        return child

    def compile(self, fn: Callable[..., list], label: str, instructions: int) -> Segment:
        """``fn`` as a compiled segment of the parent runner."""
        parent = self._runner
        segment = Segment(fn, label, instructions, parent.fixed, parent.options.fallback,
                          parent.stats)
        parent.segments.append(segment)
        return segment
