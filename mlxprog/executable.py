"""Planning into segments, ``mx.compile``, input/capture binding and stats.

A block (the program body or a subprogram) is split at host steps (ops that run
Python: ``while``, ``cond``, ``runtime_call``) into maximal straight-line
segments. Each segment is an interpreter closure wrapped in its own
``mx.compile``: traced on the first call of each input signature, replayed after.
Liveness decides which values a segment hands on; captures and constants are
closed over, so they are never passed per call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import mlx.core as mx
import numpy as np

from .dtypes import name_of, numpy_dtype
from .errors import BindingError, ProgramError
from .interpreter import run_step_eager, run_steps
from .program import Program
from .registry import AVal
from .validate import Block, Step, ValidatedProgram, validate

DEFAULT_MAX_ITERATIONS = 1_000_000


@dataclass
class SegmentStats:
    """Counters of one compiled segment."""

    location: str
    instructions: int
    traces: int = 0
    calls: int = 0


@dataclass
class Stats:
    """What an Executable has done: calls, traces, time spent tracing, and the
    shape of its plan. ``exe.stats`` is live; ``exe.stats.as_dict()`` snapshots it."""

    calls: int = 0
    traces: int = 0
    trace_seconds: float = 0.0
    instructions: int = 0
    segments: list[SegmentStats] = field(default_factory=list)
    loop_iterations: int = 0
    callback_calls: int = 0
    eager: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The counters as plain data."""
        return {
            "calls": self.calls,
            "traces": self.traces,
            "trace_seconds": round(self.trace_seconds, 6),
            "instructions": self.instructions,
            "segments": len(self.segments),
            "segment_traces": [s.traces for s in self.segments],
            "loop_iterations": self.loop_iterations,
            "callback_calls": self.callback_calls,
            "eager": self.eager,
        }

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.as_dict().items())


@dataclass(frozen=True)
class Options:
    """Execution options shared by every block of an Executable."""

    eager: bool
    check_numerics: bool
    callbacks: Mapping[str, Callable]
    max_iterations: int


class _Segment:
    """A straight-line run of steps compiled as one function of the values it reads."""

    def __init__(self, runner: BlockRunner, steps: Sequence[Step], reads, writes):
        self.steps = tuple(steps)
        self.reads = tuple(reads)
        self.writes = tuple(writes)
        self.stats = SegmentStats(steps[0].location if steps else runner.block.location, len(steps))
        n_slots = runner.block.n_slots
        fixed = runner.fixed
        n_fixed = len(fixed)
        steps_, reads_, writes_, stats = self.steps, self.reads, self.writes, self.stats

        def segment(*values):
            stats.traces += 1
            env = [*fixed, *([None] * (n_slots - n_fixed))]
            for slot, value in zip(reads_, values):
                env[slot] = value
            run_steps(steps_, env)
            return [env[s] for s in writes_]

        self.compiled = mx.compile(segment)
        self._closed_over = {id(v) for v in fixed if v is not None}

    def __call__(self, values: Sequence[mx.array], stats: Stats) -> list[mx.array]:
        # MLX rejects an input that is also a closed-over array (a constant used
        # as a loop's initial carry, say); a fresh wrapper of it is accepted.
        closed_over = self._closed_over
        values = [mx.array(v) if id(v) in closed_over else v for v in values]
        before = self.stats.traces
        start = time.perf_counter()
        out = self.compiled(*values)
        if self.stats.traces != before:
            stats.traces += 1
            stats.trace_seconds += time.perf_counter() - start
        self.stats.calls += 1
        return out


class BlockRunner:
    """Runs one validated block: its compiled segments and host steps in order.

    ``fixed`` is the environment prefix: ``None`` for each input (filled per
    call), then the captures and constants. Subprogram runners share it.
    """

    def __init__(self, block: Block, n_inputs: int, fixed: Sequence[Any],
                 options: Options, stats: Stats):
        self.block = block
        self.n_inputs = n_inputs
        self.fixed = list(fixed)
        self.options = options
        self.stats = stats
        self.units: list[_Segment | Step] = []
        self.release: list[tuple[int, ...]] = []
        self._direct: tuple | None = None
        # Subprogram runners of structured steps share captures, options, stats.
        self.children: dict[Step, dict[str, BlockRunner]] = {
            step: {name: BlockRunner(sub, n_inputs, self.fixed, options, stats)
                   for name, sub in step.blocks.items()}
            for step in block.steps if step.blocks
        }
        if options.eager:
            self.release = _release_plan(block)
        else:
            self._plan()

    def _plan(self) -> None:
        block = self.block
        groups: list[list[Step] | Step] = []
        for step in block.steps:
            if step.spec.host:
                groups.append(step)
            elif groups and isinstance(groups[-1], list):
                groups[-1].append(step)
            else:
                groups.append([step])
        # Slots needed after each group: walk backwards from the block outputs.
        needed_after: list[set[int]] = []
        live = set(block.outputs)
        for group in reversed(groups):
            needed_after.append(set(live))
            steps = group if isinstance(group, list) else [group]
            for step in steps:
                live.difference_update(step.results)
            for step in steps:
                live.update(step.args)
                live.update(_block_reads(step))
        needed_after.reverse()
        for group, after in zip(groups, needed_after):
            if not isinstance(group, list):
                self.units.append(group)
                continue
            produced = {s for step in group for s in step.results}
            reads = sorted(
                {a for step in group for a in step.args
                 if a not in produced and not self.n_inputs <= a < len(self.fixed)}
            )
            writes = [s for s in sorted(produced) if s in after]
            segment = _Segment(self, group, reads, writes)
            self.stats.segments.append(segment.stats)
            self.units.append(segment)
        if all(isinstance(u, _Segment) for u in self.units) and len(self.units) <= 1:
            self._direct = self._direct_plan()

    def _direct_plan(self) -> tuple:
        """Where a block of at most one segment reads its values and finds its
        outputs, so a call needs no environment list: (segment, reads, outputs)
        with each source a pair (0=inputs, 1=carry, 2=fixed, 3=segment results)."""
        segment = self.units[0] if self.units else None
        writes = segment.writes if segment else ()
        n_in, n_prefix = self.n_inputs, self.block.n_prefix

        def source(slot: int) -> tuple[int, int]:
            if slot < n_in:
                return 0, slot
            if slot < n_prefix:
                return 2, slot
            if slot < n_prefix + self.block.n_carry:
                return 1, slot - n_prefix
            return 3, writes.index(slot)

        reads = [source(s) for s in segment.reads] if segment else []
        return segment, reads, [source(s) for s in self.block.outputs]

    def run(self, inputs: Sequence[mx.array], carry: Sequence[mx.array] = ()) -> list[mx.array]:
        """Run the block on the program inputs and (for subprograms) the carry."""
        if self._direct is not None:
            segment, reads, outputs = self._direct
            sources = [inputs, carry, self.fixed, ()]
            if segment is not None:
                sources[3] = segment([sources[k][i] for k, i in reads], self.stats)
            return [sources[k][i] for k, i in outputs]
        block = self.block
        env = self.fixed + [None] * (block.n_slots - len(self.fixed))
        env[: self.n_inputs] = inputs
        env[block.n_prefix : block.n_prefix + block.n_carry] = carry
        if self.options.eager:
            self._run_eager(env)
        else:
            for unit in self.units:
                if isinstance(unit, _Segment):
                    out = unit([env[s] for s in unit.reads], self.stats)
                    for slot, value in zip(unit.writes, out):
                        env[slot] = value
                else:
                    self._run_host(unit, env)
        return [env[s] for s in block.outputs]

    def _run_eager(self, env: list) -> None:
        check = self.options.check_numerics
        for step, release in zip(self.block.steps, self.release):
            if step.spec.host:
                self._run_host(step, env)
                for slot in release:
                    env[slot] = None
            else:
                run_step_eager(step, env, release, check)

    def _run_host(self, step: Step, env: list) -> None:
        operands = [env[i] for i in step.args]
        results = step.spec.impl(self, step, operands, env[: self.n_inputs])
        env[step.out : step.out + step.n_out] = results


def _block_reads(step: Step) -> set[int]:
    """Slots of the enclosing environment that a step's subprograms read directly
    (inputs, captures, constants)."""
    reads: set[int] = set()
    for block in step.blocks.values():
        for sub in block.steps:
            reads.update(a for a in sub.args if a < block.n_prefix)
            reads.update(_block_reads(sub))
        reads.update(s for s in block.outputs if s < block.n_prefix)
    return reads


def _release_plan(block: Block) -> list[tuple[int, ...]]:
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
    return [tuple(p) for p in plan]


class Executable:
    """A compiled program: call it with the program's inputs, get its outputs.

    Build one with :func:`mlxprog.compile`. Inputs may be ``mx.array``, numpy
    arrays or Python scalars/lists, positionally or by input name; they are
    checked against the input specs. Outputs are a list of (lazy) ``mx.array``.
    """

    def __init__(self, validated: ValidatedProgram, capture_values: Sequence[mx.array],
                 options: Options):
        self.validated = validated
        self.program = validated.program
        self.options = options
        self.stats = Stats(instructions=_count_instructions(validated.block), eager=options.eager)
        self._input_avals = validated.input_avals
        self._input_names = [s.name for s in validated.program.inputs]
        fixed = [None] * len(self._input_avals) + [*capture_values, *validated.constants]
        self._runner = BlockRunner(
            validated.block, len(self._input_avals), fixed, options, self.stats
        )

    @property
    def input_names(self) -> list[str]:
        """Names of the inputs, in call order."""
        return list(self._input_names)

    @property
    def out_avals(self) -> list[AVal]:
        """Shapes and dtypes of the outputs."""
        return self.validated.out_avals

    def __call__(self, *args: Any, **kwargs: Any) -> list[mx.array]:
        values = self._bind(args, kwargs)
        self.stats.calls += 1
        return self._runner.run(values)

    def _bind(self, args: tuple, kwargs: dict) -> list[mx.array]:
        names = self._input_names
        if kwargs:
            args = self._merge_kwargs(args, kwargs)
        if len(args) != len(names):
            raise BindingError(
                f"program {self.program.name or '<unnamed>'} takes {len(names)} input(s) "
                f"({', '.join(names) or 'none'}), got {len(args)}"
            )
        values = []
        for name, aval, value in zip(names, self._input_avals, args):
            if isinstance(value, mx.array):
                if value.shape != aval.shape or value.dtype != aval.dtype:
                    _mismatch(name, aval, value.shape, value.dtype)
            else:
                value = _to_array(name, aval, value)
            values.append(value)
        return values

    def _merge_kwargs(self, args: tuple, kwargs: dict) -> tuple:
        names = self._input_names
        merged = list(args)
        for name in names[len(args):]:
            if name not in kwargs:
                raise BindingError(f"missing input {name!r}")
            merged.append(kwargs.pop(name))
        if kwargs:
            unknown = ", ".join(repr(k) for k in kwargs)
            raise BindingError(f"unknown or repeated input(s) {unknown}; inputs are {names}")
        return tuple(merged)


def _mismatch(name: str, aval: AVal, shape, dtype) -> None:
    raise BindingError(
        f"input {name!r} expects {name_of(aval.dtype)}{list(aval.shape)}, "
        f"got {name_of(dtype) if isinstance(dtype, mx.Dtype) else dtype}{list(shape)}"
    )


def _to_array(name: str, aval: AVal, value: Any) -> mx.array:
    if isinstance(value, np.ndarray):
        expected = numpy_dtype(aval.dtype)
        if value.dtype != expected or aval.dtype == mx.bfloat16:
            if not (aval.dtype == mx.bfloat16 and value.dtype == np.float32):
                _mismatch(name, aval, value.shape, value.dtype)
        if tuple(value.shape) != aval.shape:
            _mismatch(name, aval, value.shape, value.dtype)
        return mx.array(value, dtype=aval.dtype)
    try:
        array = mx.array(value, dtype=aval.dtype)
    except (TypeError, ValueError) as exc:
        raise BindingError(f"input {name!r}: cannot convert {type(value).__name__}: {exc}") from None
    if array.shape != aval.shape:
        _mismatch(name, aval, array.shape, aval.dtype)
    return array


def _check_callbacks(block: Block, callbacks: Mapping[str, Callable]) -> None:
    """Every ``runtime_call`` must name a callable given in ``callbacks``."""
    for step in block.steps:
        if step.spec.name == "runtime_call":
            name = step.attrs.callback
            if not callable(callbacks.get(name)):
                given = ", ".join(sorted(callbacks)) or "none"
                raise BindingError(
                    f"{step.location} (runtime_call) names callback {name!r}, which is not "
                    f"in the callbacks given to compile (given: {given})"
                )
        for sub in step.blocks.values():
            _check_callbacks(sub, callbacks)


def _count_instructions(block: Block) -> int:
    return sum(1 + sum(_count_instructions(b) for b in s.blocks.values()) for s in block.steps)


def load_weights(paths: str | Path | Sequence[str | Path]) -> dict[str, mx.array]:
    """Read arrays by name from ``.safetensors``, ``.npz`` or ``.gguf`` files."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    weights: dict[str, mx.array] = {}
    for path in paths:
        try:
            loaded = mx.load(str(path))
        except Exception as exc:  # MLX raises bare RuntimeError/ValueError for bad files
            raise BindingError(f"cannot read weights file {str(path)!r}: {exc}") from None
        if isinstance(loaded, tuple):
            loaded = loaded[0]
        if not isinstance(loaded, dict):
            raise BindingError(f"weights file {str(path)!r} holds one array, not named arrays")
        weights.update(loaded)
    return weights


def bind_captures(validated: ValidatedProgram, captures: Mapping[str, Any] | None,
                  weights: str | Path | Sequence[str | Path] | None) -> list[mx.array]:
    """The capture arrays in declaration order, checked against their specs."""
    available: dict[str, Any] = {}
    if weights is not None:
        available.update(load_weights(weights))
    if captures:
        available.update(captures)
    values = []
    for spec, aval in zip(validated.program.captures, validated.capture_avals):
        if spec.name not in available:
            raise BindingError(
                f"capture {spec.name!r} ({name_of(aval.dtype)}{list(aval.shape)}) is not bound: "
                "pass it in captures= or a weights= file"
            )
        value = available[spec.name]
        if not isinstance(value, mx.array):
            if isinstance(value, np.ndarray) and value.dtype != numpy_dtype(aval.dtype):
                raise BindingError(
                    f"capture {spec.name!r} expects {name_of(aval.dtype)}, got {value.dtype}"
                )
            value = mx.array(value, dtype=aval.dtype)
        if value.shape != aval.shape or value.dtype != aval.dtype:
            raise BindingError(
                f"capture {spec.name!r} expects {name_of(aval.dtype)}{list(aval.shape)}, "
                f"got {name_of(value.dtype)}{list(value.shape)}"
            )
        values.append(value)
    return values


def compile(program: Program | ValidatedProgram, captures: Mapping[str, Any] | None = None,
            weights: str | Path | Sequence[str | Path] | None = None,
            callbacks: Mapping[str, Callable] | None = None, eager: bool = False,
            check_numerics: bool = False,
            max_iterations: int = DEFAULT_MAX_ITERATIONS) -> Executable:
    """Validate a program, bind its captures and return an :class:`Executable`.

    ``captures`` maps capture names to arrays; ``weights`` names files read with
    ``mx.load`` (both may be given; ``captures`` wins). ``callbacks`` maps the
    names used by ``runtime_call`` to Python callables. ``eager=True`` runs the
    interpreter without ``mx.compile``, evaluating each instruction and freeing
    values after their last use; ``check_numerics=True`` (eager only) raises on
    the first NaN/Inf. ``max_iterations`` is the default loop limit.
    """
    validated = program if isinstance(program, ValidatedProgram) else validate(program)
    if check_numerics and not eager:
        raise ProgramError("check_numerics=True needs eager=True (compiled graphs are opaque)")
    capture_values = bind_captures(validated, captures, weights)
    # Compiled segments close over these; MLX requires closed-over arrays to be
    # materialised (a lazy one is an "uncaptured input").
    mx.eval(capture_values, validated.constants)
    callbacks = dict(callbacks or {})
    _check_callbacks(validated.block, callbacks)
    options = Options(eager, check_numerics, callbacks, max_iterations)
    return Executable(validated, capture_values, options)


def run(program: Program | ValidatedProgram, *inputs: Any, **compile_kwargs: Any) -> list[mx.array]:
    """Compile ``program`` and call it once: ``run(prog, x, y, captures={...})``."""
    return compile(program, **compile_kwargs)(*inputs)
