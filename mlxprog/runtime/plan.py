"""Planning: a validated block split into compiled segments and host steps.

:func:`plan_block` is pure: it reads a block and returns a :class:`Plan`,
which the runner turns into compiled functions and ``mlxprog inspect``
prints (:func:`describe`). A block is split at host steps (ops that run
Python: ``while``, ``cond``, ``runtime_call``) into maximal straight-line
segments; liveness decides which values each segment hands on. Captures and
constants are closed over by the segments, so they are never passed per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ..format.paths import StepPath
from ..validate.steps import Block, Step


@dataclass(frozen=True)
class SegmentPlan:
    """A run of steps compiled as one function. ``reads`` are the environment
    slots it takes per call (inputs, carry, earlier results); ``writes`` the
    slots it produces that are needed later. ``shapeless`` segments of a
    symbolic program serve every binding with one trace. A ``sync`` segment
    starts with a ``recv``: what the block computed before it is evaluated
    first (see :func:`_waits`)."""

    steps: tuple[Step, ...]
    reads: tuple[int, ...]
    writes: tuple[int, ...]
    shapeless: bool
    sync: bool = False

    @property
    def key(self) -> tuple[StepPath, StepPath]:
        """The paths of its first and last step: the same segment in every
        specialisation of a symbolic program."""
        return self.steps[0].path, self.steps[-1].path

    @property
    def label(self) -> str:
        """Where it starts, for messages and stats."""
        return self.steps[0].location


@dataclass(frozen=True)
class HostPlan:
    """A host step, run between segments."""

    step: Step


Unit = Union[SegmentPlan, HostPlan]


@dataclass(frozen=True)
class Plan:
    """How a block runs: compiled, its ``units`` in order; eager, its steps in
    order, freeing after step ``i`` the result slots in ``release[i]``.
    ``kept`` are the results of steps whose op must run even when nothing
    reads them (``send``): segments hand them on and the runner ties them to
    the block's outputs."""

    block: Block
    units: tuple[Unit, ...]
    release: tuple[tuple[int, ...], ...]
    kept: tuple[int, ...] = ()

    @property
    def single_segment(self) -> bool:
        """At most one unit, and no host step: the block is one function."""
        return len(self.units) <= 1 and all(isinstance(u, SegmentPlan) for u in self.units)


def plan_block(block: Block, n_inputs: int, dim_dependent: frozenset[StepPath] | None = None) -> Plan:
    """The plan of ``block``, whose environment starts with ``n_inputs`` program
    inputs. ``dim_dependent`` (symbolic programs only) holds the paths of the
    steps whose attributes use dims; None for a static program, whose
    segments are never shapeless."""
    groups = _group_steps(block)
    kept = tuple(s for step in block.steps if step.spec.keep for s in step.results)
    # Slots needed after each group: walk backwards from the block outputs.
    needed_after: list[set[int]] = []
    live = set(block.outputs) | set(kept)
    for group in reversed(groups):
        needed_after.append(set(live))
        for step in group:
            live.difference_update(step.results)
        for step in group:
            live.update(step.args)
            live.update(_subprogram_reads(step))
    needed_after.reverse()
    units: list[Unit] = []
    for group, after in zip(groups, needed_after):
        if group[0].spec.host is not None:
            units.append(HostPlan(group[0]))
            continue
        produced = {s for step in group for s in step.results}
        reads = sorted({a for step in group for a in step.args
                        if a not in produced and not n_inputs <= a < block.n_prefix})
        writes = [s for s in sorted(produced) if s in after]
        shapeless = dim_dependent is not None and all(
            _shapeless(step, block, dim_dependent) for step in group)
        units.append(SegmentPlan(tuple(group), tuple(reads), tuple(writes), shapeless,
                                 _waits(group[0])))
    return Plan(block, tuple(units), _release_plan(block), kept)


def _shapeless(step: Step, block: Block, dim_dependent: frozenset[StepPath]) -> bool:
    """Whether a step's trace can serve every binding: a shape-polymorphic op
    whose attributes use no dims, with no operand axis of size 1 (MLX 0.32's
    shapeless compilation specialises a reduction over a size-1 axis and then
    crashes the process for other sizes; a dim bound to 1 is handled by the
    executable)."""
    if not step.spec.shapeless or step.path in dim_dependent:
        return False
    avals = block.avals
    return not any(1 in avals[slot].shape for slot in step.args)


def describe(block: Block, n_inputs: int, dim_dependent: frozenset[StepPath] | None = None,
             depth: int = 0) -> list[str]:
    """One line per segment and host step of the block's plan, subprograms
    indented below their host step (for ``mlxprog inspect``)."""
    lines = []
    pad = "  " * depth
    for unit in plan_block(block, n_inputs, dim_dependent).units:
        if isinstance(unit, HostPlan):
            lines.append(f"{pad}host: {unit.step.location} ({unit.step.spec.name})")
            for sub in unit.step.blocks.values():
                lines.extend(describe(sub, n_inputs, dim_dependent, depth + 1))
            continue
        kind = ("compiled" if dim_dependent is None else
                "shapeless" if unit.shapeless else "one trace per binding")
        first, last = unit.steps[0], unit.steps[-1]
        span = first.location if first is last else f"{first.location} .. instruction {last.index}"
        lines.append(f"{pad}segment: {span} ({len(unit.steps)} op(s), {kind})")
    return lines


def _waits(step: Step) -> bool:
    """Whether a step waits for another rank without operands (``recv``).

    Other communicating steps are ordered by their operands (see
    :func:`~mlxprog.runtime.interpreter.run_steps`); an operand-free one
    could run before earlier communication of its own block, and a ``recv``
    that waits for a ``send`` the other rank makes only after this rank's
    earlier ``send`` or collective waits forever. So it starts a segment, run
    once what came before it is evaluated."""
    return step.spec.distributed == "point_to_point" and not step.args


def _group_steps(block: Block) -> list[list[Step]]:
    """Maximal runs of compilable steps, with each host step on its own and
    each operand-free ``recv`` starting a run."""
    groups: list[list[Step]] = []
    for step in block.steps:
        if step.spec.host is not None or _waits(step):
            groups.append([step])
        elif groups and groups[-1][0].spec.host is None:
            groups[-1].append(step)
        else:
            groups.append([step])
    return groups


def _subprogram_reads(step: Step) -> set[int]:
    """Slots of the enclosing environment that a step's subprograms read directly
    (inputs, captures, constants)."""
    reads: set[int] = set()
    for block in step.blocks.values():
        for sub in block.steps:
            reads.update(a for a in sub.args if a < block.n_prefix)
            reads.update(_subprogram_reads(sub))
        reads.update(s for s in block.outputs if s < block.n_prefix)
    return reads


def _release_plan(block: Block) -> tuple[tuple[int, ...], ...]:
    """For each step, the result slots whose last use it is (eager mode frees them).
    Block outputs are never released; results nobody reads are freed at once."""
    keep = set(block.outputs)
    last_use: dict[int, int] = {}
    for i, step in enumerate(block.steps):
        for slot in step.results:
            last_use[slot] = i
        for slot in step.args:
            if slot >= block.n_prefix:
                last_use[slot] = i
    plan: list[list[int]] = [[] for _ in block.steps]
    for slot, i in last_use.items():
        if slot not in keep:
            plan[i].append(slot)
    return tuple(tuple(p) for p in plan)
