"""Planning into segments, ``mx.compile``, input/capture binding and stats.

A block (the program body or a subprogram) is split at host steps (ops that run
Python: ``while``, ``cond``, ``runtime_call``) into maximal straight-line
segments. Each segment is an interpreter closure wrapped in its own
``mx.compile``: traced on the first call of each input signature, replayed after.
Liveness decides which values a segment hands on; captures and constants are
closed over, so they are never passed per call.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import mlx.core as mx
import numpy as np

from . import dims as D
from . import native as native_kernels
from .dtypes import name_of, numpy_dtype, to_mlx
from .errors import BindingError, ProgramError, TraceError
from .interpreter import run_step_eager, run_steps
from .program import Program
from .registry import AVal
from .symbolic import SymbolicProgram
from .validate import Block, Step, ValidatedProgram, exact_array, validate

DEFAULT_MAX_ITERATIONS = 1_000_000
DEFAULT_MAX_TRACES = 16
_MAX_REMEMBERED_SHAPES = 256  # input-shape tuples whose dim binding is kept


@dataclass
class SegmentStats:
    """Counters of one compiled segment. ``shapeless`` segments serve every
    binding of a symbolic program with one trace; ``fallback`` ones failed to
    trace and run eagerly."""

    location: str
    instructions: int
    traces: int = 0
    calls: int = 0
    shapeless: bool = False
    fallback: bool = False


@dataclass
class Stats:
    """What an Executable has done: calls, traces, time spent tracing, the shape
    of its plan, and (symbolic programs) its trace cache. ``native`` says
    whether native CPU kernels were allowed; ``native_ops`` counts, by op, the
    instructions that took one (once per trace when compiled, once per call
    when eager). ``exe.stats`` is live; ``exe.stats.as_dict()`` snapshots it."""

    calls: int = 0
    traces: int = 0
    trace_seconds: float = 0.0
    instructions: int = 0
    segments: list[SegmentStats] = field(default_factory=list)
    loop_iterations: int = 0
    callback_calls: int = 0
    eager: bool = False
    cache_hits: int = 0
    cache_misses: int = 0
    cache_evictions: int = 0
    bindings: list[dict[str, int]] = field(default_factory=list)
    fallbacks: int = 0
    native: bool = False
    native_ops: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The counters as plain data."""
        return {
            "calls": self.calls,
            "traces": self.traces,
            "trace_seconds": round(self.trace_seconds, 6),
            "instructions": self.instructions,
            "segments": len(self.segments),
            "segment_traces": [s.traces for s in self.segments],
            "shapeless_segments": sum(s.shapeless for s in self.segments),
            "loop_iterations": self.loop_iterations,
            "callback_calls": self.callback_calls,
            "eager": self.eager,
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            "cache_evictions": self.cache_evictions,
            "cached_bindings": [dict(b) for b in self.bindings],
            "fallbacks": self.fallbacks,
            "native": self.native,
            "native_ops": dict(self.native_ops),
        }

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.as_dict().items())


@dataclass(frozen=True)
class Options:
    """Execution options shared by every block of an Executable.

    ``shared_segments`` (symbolic programs) holds the shapeless segments that
    every binding reuses; ``symbolic_locations`` names the instructions whose
    attributes depend on dims (their segments cannot be shapeless).
    """

    eager: bool
    check_numerics: bool
    callbacks: Mapping[str, Callable]
    max_iterations: int
    fallback: str = "eager"
    native: bool = True
    shared_segments: dict | None = None
    symbolic_locations: frozenset = frozenset()


class _Segment:
    """A function of arrays compiled with its own ``mx.compile``: a straight-line
    run of steps (:meth:`of_steps`), or a fused loop iteration (see
    :meth:`BlockRunner.fused_iteration`). ``reads``/``writes`` are the
    environment slots it reads and hands on."""

    def __init__(self, interpret: Callable, location: str, instructions: int,
                 closed_over: Sequence[Any], fallback_policy: str, reads=(), writes=(),
                 shapeless: bool = False):
        self.reads = tuple(reads)
        self.writes = tuple(writes)
        self.fallback_policy = fallback_policy
        self.stats = stats = SegmentStats(location, instructions, shapeless=shapeless)

        def segment(*values):
            stats.traces += 1
            return interpret(*values)

        self.interpret = interpret
        self.compiled = mx.compile(segment, shapeless=shapeless)
        self._closed_over = {id(v) for v in closed_over if v is not None}

    @classmethod
    def of_steps(cls, runner: BlockRunner, steps: Sequence[Step], reads, writes,
                 shapeless: bool = False) -> _Segment:
        """The interpreter of ``steps`` over ``runner``'s environment layout."""
        fixed, n_slots = runner.fixed, runner.block.n_slots
        padding = [None] * (n_slots - len(fixed))
        steps, reads, writes = tuple(steps), tuple(reads), tuple(writes)

        def interpret(*values):
            env = [*fixed, *padding]
            for slot, value in zip(reads, values):
                env[slot] = value
            run_steps(steps, env)
            return [env[s] for s in writes]

        return cls(interpret, steps[0].location, len(steps), fixed, runner.options.fallback,
                   reads, writes, shapeless)

    def __call__(self, values: Sequence[mx.array], stats: Stats) -> list[mx.array]:
        # MLX rejects an input that is also a closed-over array (a constant used
        # as a loop's initial carry, say); a fresh wrapper of it is accepted.
        closed_over = self._closed_over
        if not closed_over.isdisjoint(map(id, values)):
            values = [mx.array(v) if id(v) in closed_over else v for v in values]
        before = self.stats.traces
        start = time.perf_counter()
        try:
            out = self.compiled(*values)
        except ProgramError:
            raise
        except Exception as exc:
            if self.stats.traces == before:
                raise
            out = self._fall_back(exc, values, stats)
        if self.stats.traces != before:
            stats.traces += 1
            stats.trace_seconds += time.perf_counter() - start
        self.stats.calls += 1
        return out

    def _fall_back(self, exc: Exception, values: Sequence[mx.array], stats: Stats) -> list:
        """Tracing failed for a reason validation could not see (an op MLX cannot
        compile): run this segment eagerly from now on, or raise."""
        where = self.stats.location
        if self.fallback_policy == "raise":
            raise TraceError(f"tracing the segment starting at {where} failed: "
                             f"{type(exc).__name__}: {exc}") from exc
        warnings.warn(f"mlxprog: tracing the segment starting at {where} failed "
                      f"({type(exc).__name__}: {exc}); running it eagerly", RuntimeWarning,
                      stacklevel=4)
        self.compiled = self.interpret
        self.stats.fallback = True
        stats.fallbacks += 1
        return self.interpret(*values)


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
        # Stats of the segments this runner and its subprograms' runners use.
        self.segment_stats: list[SegmentStats] = []
        self._direct: tuple | None = None
        self._fused: dict[Step, _Segment | None] = {}
        self._results = [None] * (block.n_slots - block.n_prefix - block.n_carry)
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
        for runners in self.children.values():
            for child in runners.values():
                self.segment_stats.extend(child.segment_stats)

    def _plan(self) -> None:
        block = self.block
        groups = _group_steps(block)
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
            self.units.append(self._segment(group, reads, writes))
        if all(isinstance(u, _Segment) for u in self.units) and len(self.units) <= 1:
            self._direct = self._direct_plan()

    def _segment(self, group: list[Step], reads, writes) -> _Segment:
        shared = self.options.shared_segments
        if shared is not None and _shapeless(group, self.options.symbolic_locations):
            key = (group[0].location, group[-1].location)
            if key not in shared:
                shared[key] = _Segment.of_steps(self, group, reads, writes, shapeless=True)
            self.segment_stats.append(shared[key].stats)
            return shared[key]
        segment = _Segment.of_steps(self, group, reads, writes)
        self.segment_stats.append(segment.stats)
        return segment

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

    def direct_function(self) -> Callable | None:
        """The block as one uncompiled function ``(inputs, carry) -> outputs``,
        when it is at most one segment (else None)."""
        if self._direct is None:
            return None
        segment, reads, outputs = self._direct
        fixed = self.fixed

        def run(inputs, carry):
            sources = [inputs, carry, fixed, ()]
            if segment is not None:
                sources[3] = segment.interpret(*[sources[k][i] for k, i in reads])
            return [sources[k][i] for k, i in outputs]

        return run

    def fused_iteration(self, step: Step) -> _Segment | None:
        """For a ``while`` whose ``body`` and ``cond`` are each a single segment:
        one compiled function running the body and then the condition on the new
        carry, so an iteration is one compiled call. Built once per step; None
        when a subprogram has host steps."""
        if step not in self._fused:
            body = self.children[step]["body"].direct_function()
            cond = self.children[step]["cond"].direct_function()
            fused = None
            if body is not None and cond is not None:
                n_inputs = self.n_inputs

                def iterate(*values):
                    inputs, carry = values[:n_inputs], values[n_inputs:]
                    new_carry = body(inputs, carry)
                    return [*new_carry, cond(inputs, new_carry)[0]]

                fused = _Segment(iterate, f"{step.location} > body + cond",
                                 _count_instructions(step.blocks["body"])
                                 + _count_instructions(step.blocks["cond"]),
                                 self.fixed, self.options.fallback)
                self.segment_stats.append(fused.stats)
                self.stats.segments.append(fused.stats)
            self._fused[step] = fused
        return self._fused[step]

    def run(self, inputs: Sequence[mx.array], carry: Sequence[mx.array] = ()) -> list[mx.array]:
        """Run the block on the program inputs and (for subprograms) the carry."""
        if self._direct is not None:
            segment, reads, outputs = self._direct
            sources = [inputs, carry, self.fixed, ()]
            if segment is not None:
                sources[3] = segment([sources[k][i] for k, i in reads], self.stats)
            return [sources[k][i] for k, i in outputs]
        block = self.block
        env = [*inputs, *self.fixed[self.n_inputs:], *carry, *self._results]
        if self.options.eager:
            self._run_eager(env)
        else:
            stats = self.stats
            for unit in self.units:
                if type(unit) is _Segment:
                    out = unit([env[s] for s in unit.reads], stats)
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


def _group_steps(block: Block) -> list[list[Step] | Step]:
    """Maximal runs of compilable steps, with each host step on its own."""
    groups: list[list[Step] | Step] = []
    for step in block.steps:
        if step.spec.host:
            groups.append(step)
        elif groups and isinstance(groups[-1], list):
            groups[-1].append(step)
        else:
            groups.append([step])
    return groups


def _shapeless(group: Sequence[Step], symbolic_locations: frozenset) -> bool:
    """Whether a segment can serve every binding with one shapeless trace."""
    return all(step.spec.shapeless and step.location not in symbolic_locations
               for step in group)


def plan_summary(validated: ValidatedProgram | SymbolicProgram) -> list[str]:
    """One line per segment and host step of the plan, subprograms indented
    (for ``mlxprog inspect``)."""
    symbolic = isinstance(validated, SymbolicProgram)
    locations = validated.symbolic_locations if symbolic else frozenset()
    block = validated.sample.block if symbolic else validated.block

    def describe(block: Block, depth: int) -> list[str]:
        lines = []
        for group in _group_steps(block):
            pad = "  " * depth
            if isinstance(group, list):
                kind = "shapeless" if symbolic and _shapeless(group, locations) else (
                    "one trace per binding" if symbolic else "compiled")
                span = group[0].location if len(group) == 1 else \
                    f"{group[0].location} .. {group[-1].location.rsplit('> ', 1)[-1]}"
                lines.append(f"{pad}segment: {span} ({len(group)} op(s), {kind})")
            else:
                lines.append(f"{pad}host: {group.location} ({group.spec.name})")
                for sub in group.blocks.values():
                    lines.extend(describe(sub, depth + 1))
        return lines

    return describe(block, 0)


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

    A program with symbolic dims binds them from the input shapes on each call
    and keeps one specialised plan per binding in an LRU cache of
    ``max_traces`` entries; segments made only of shape-polymorphic ops are
    compiled shapeless and shared by every binding.
    """

    def __init__(self, validated: ValidatedProgram | SymbolicProgram,
                 capture_values: Sequence[mx.array], options: Options,
                 max_traces: int = DEFAULT_MAX_TRACES,
                 buckets: Mapping[str, str | Sequence[int]] | None = None):
        self.validated = validated
        self.program = validated.program
        self.options = options
        self.stats = Stats(eager=options.eager, native=options.native)
        self._native = native_kernels.Scope(options.native, self.stats.native_ops)
        self._captures = list(capture_values)
        specs = validated.program.inputs
        self._input_names = [s.name for s in specs if s.value_of is None]
        self._input_dtypes = [to_mlx(s.dtype) for s in specs if s.value_of is None]
        self._symbolic = isinstance(validated, SymbolicProgram)
        if self._symbolic:
            self._max_traces = max_traces
            self._buckets = _check_buckets(buckets or {}, validated)
            self._runners: OrderedDict[tuple, BlockRunner] = OrderedDict()
            self._declared = [shape for shape, s in zip(validated.input_shapes, specs)
                              if s.value_of is None]
            self._value_of = [None if s.value_of is None else (s.value_of, to_mlx(s.dtype))
                              for s in specs]
            self._bindings_of: dict[tuple, dict[str, int]] = {}  # input shapes -> dims
            self.stats.instructions = _count_instructions(validated.sample.block)
        else:
            if buckets:
                raise BindingError("buckets= needs a program with symbolic dims")
            self._input_avals = validated.input_avals
            self._runner = self._make_runner(validated)
            self.stats.segments.extend(self._runner.segment_stats)
            self.stats.instructions = _count_instructions(validated.block)

    def _make_runner(self, validated: ValidatedProgram,
                     options: Options | None = None) -> BlockRunner:
        fixed = [None] * len(validated.input_avals) + [*self._captures, *validated.constants]
        mx.eval(validated.constants)
        return BlockRunner(validated.block, len(validated.input_avals), fixed,
                           options or self.options, self.stats)

    @property
    def input_names(self) -> list[str]:
        """Names of the inputs a caller passes, in call order."""
        return list(self._input_names)

    @property
    def out_avals(self) -> list[AVal]:
        """Shapes and dtypes of the outputs (static programs)."""
        if self._symbolic:
            raise ProgramError("a symbolic program's output shapes depend on its dims; "
                               "see exe.validated.describe_outputs()")
        return self.validated.out_avals

    def __call__(self, *args: Any, **kwargs: Any) -> list[mx.array]:
        token = native_kernels.enter(self._native)
        try:
            if self._symbolic:
                return self._call_symbolic(args, kwargs)
            values = self._bind(args, kwargs)
            self.stats.calls += 1
            return self._runner.run(values)
        finally:
            native_kernels.leave(token)

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

    def _call_symbolic(self, args: tuple, kwargs: dict) -> list[mx.array]:
        if kwargs:
            args = self._merge_kwargs(args, kwargs)
        names = self._input_names
        if len(args) != len(names):
            raise BindingError(
                f"program {self.program.name or '<unnamed>'} takes {len(names)} input(s) "
                f"({', '.join(names) or 'none'}), got {len(args)}"
            )
        values = [
            _to_array(name, AVal(None, dtype), value) if not isinstance(value, mx.array)
            else _check_dtype(name, dtype, value)
            for name, dtype, value in zip(names, self._input_dtypes, args)
        ]
        shapes = tuple(tuple(v.shape) for v in values)
        bindings = self._bindings_of.get(shapes)
        if bindings is None:
            # Solving the dims takes a Python pass over every input axis; a
            # decode loop calls with the same shapes again and again.
            bindings = D.bind_dims(
                [(n, list(d), s) for n, d, s in zip(names, self._declared, shapes)],
                self.validated.dims,
            )
            if len(self._bindings_of) >= _MAX_REMEMBERED_SHAPES:
                self._bindings_of.pop(next(iter(self._bindings_of)))
            self._bindings_of[shapes] = bindings
        run_bindings = {d: _bucket(v, self._buckets[d], self.validated.dims[d])
                        if d in self._buckets else v for d, v in bindings.items()}
        padded = run_bindings != bindings
        if padded:
            values = [_pad(v, declared, run_bindings)
                      for v, declared in zip(values, self._declared)]
        runner = self._runner_for(run_bindings)
        given = iter(values)
        inputs = [next(given) if dim is None else mx.array(bindings[dim[0]], dtype=dim[1])
                  for dim in self._value_of]
        self.stats.calls += 1
        outputs = runner.run(inputs)
        if padded:
            outputs = [_unpad(o, shape, bindings)
                       for o, shape in zip(outputs, self.validated.out_shapes)]
        return outputs

    def _runner_for(self, bindings: dict[str, int]) -> BlockRunner:
        key = tuple(sorted(bindings.items()))
        runner = self._runners.get(key)
        if runner is not None:
            self._runners.move_to_end(key)
            self.stats.cache_hits += 1
            return runner
        self.stats.cache_misses += 1
        specialized = self.validated.specialize(bindings)
        options = self.options
        if 1 in bindings.values():
            # MLX 0.32's shapeless compilation crashes the process when an axis
            # it reduces has size 1, so such bindings get traces of their own.
            options = dataclasses.replace(options, shared_segments=None)
        runner = self._make_runner(specialized, options)
        self._runners[key] = runner
        self.stats.segments.extend(s for s in runner.segment_stats
                                   if not any(s is t for t in self.stats.segments))
        if len(self._runners) > self._max_traces:
            self._runners.popitem(last=False)
            self.stats.cache_evictions += 1
            alive = {id(s) for r in self._runners.values() for s in r.segment_stats}
            self.stats.segments = [s for s in self.stats.segments if id(s) in alive]
        self.stats.bindings = [dict(k) for k in self._runners]
        return runner

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


def _check_dtype(name: str, dtype: mx.Dtype, value: mx.array) -> mx.array:
    if value.dtype != dtype:
        raise BindingError(f"input {name!r} expects {name_of(dtype)}, got {name_of(value.dtype)}")
    return value


def _check_buckets(buckets: Mapping[str, Any], program: SymbolicProgram) -> dict[str, Any]:
    for dim, policy in buckets.items():
        if dim not in program.dims:
            raise BindingError(f"buckets names unknown dim {dim!r} "
                               f"(dims: {', '.join(sorted(program.dims))})")
        if policy != "pow2" and not (
            isinstance(policy, (list, tuple)) and policy and all(
                isinstance(v, int) and v >= 0 for v in policy)
        ):
            raise BindingError(f"bucket policy for {dim!r} must be 'pow2' or a list of sizes, "
                               f"got {policy!r}")
    return {d: (p if p == "pow2" else sorted(p)) for d, p in buckets.items()}


def _bucket(value: int, policy: str | list[int], spec: D.DimSpec) -> int:
    """The bucket a dim value is padded up to (the value itself if no bucket fits)."""
    if policy == "pow2":
        size = 1
        while size < value:
            size *= 2
    else:
        size = next((b for b in policy if b >= value), value)
    if spec.max is not None and size > spec.max:
        size = max(value, spec.max)
    return size


def _pad(value: mx.array, declared: Sequence[D.Expr], bindings: Mapping[str, int]) -> mx.array:
    """Zero-pad each symbolic axis at its end to its size under ``bindings``."""
    widths = [(0, D.evaluate(e, bindings) - size) for e, size in zip(declared, value.shape)]
    if not any(high for _, high in widths):
        return value
    return mx.pad(value, widths)


def _unpad(value: mx.array, shape: Sequence[D.Expr | None], bindings: Mapping[str, int]) -> mx.array:
    """Cut each output axis whose size is a dim expression back to its true size."""
    index = tuple(slice(0, D.evaluate(e, bindings)) if e is not None and not isinstance(e, int)
                  else slice(None) for e in shape)
    return value[index] if index else value


def _mismatch(name: str, aval: AVal, shape, dtype) -> None:
    expected = name_of(aval.dtype) + ("" if aval.shape is None else str(list(aval.shape)))
    raise BindingError(
        f"input {name!r} expects {expected}, "
        f"got {name_of(dtype) if isinstance(dtype, mx.Dtype) else dtype}{list(shape)}"
    )


def _to_array(name: str, aval: AVal, value: Any) -> mx.array:
    if isinstance(value, np.ndarray):
        expected = numpy_dtype(aval.dtype)
        if value.dtype != expected or aval.dtype == mx.bfloat16:
            if not (aval.dtype == mx.bfloat16 and value.dtype == np.float32):
                _mismatch(name, aval, value.shape, value.dtype)
        if aval.shape is not None and tuple(value.shape) != aval.shape:
            _mismatch(name, aval, value.shape, value.dtype)
        return mx.array(value, dtype=aval.dtype)
    try:
        array = exact_array(value, aval.dtype)
    except ValueError as exc:
        raise BindingError(f"input {name!r}: {exc}") from None
    if aval.shape is not None and array.shape != aval.shape:
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


def _has_native_kernels(block: Block) -> bool:
    """Whether a block or its subprograms has an op with a native CPU kernel."""
    return any(step.spec.native_coverage is not None
               or any(_has_native_kernels(sub) for sub in step.blocks.values())
               for step in block.steps)


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


def compile(program: Program | ValidatedProgram | SymbolicProgram,
            captures: Mapping[str, Any] | None = None,
            weights: str | Path | Sequence[str | Path] | None = None,
            callbacks: Mapping[str, Callable] | None = None, eager: bool = False,
            check_numerics: bool = False, max_iterations: int = DEFAULT_MAX_ITERATIONS,
            max_traces: int = DEFAULT_MAX_TRACES,
            buckets: Mapping[str, str | Sequence[int]] | None = None,
            fallback: str = "eager", native: bool | None = None) -> Executable:
    """Validate a program, bind its captures and return an :class:`Executable`.

    ``captures`` maps capture names to arrays; ``weights`` names files read with
    ``mx.load`` (both may be given; ``captures`` wins). ``callbacks`` maps the
    names used by ``runtime_call`` to Python callables. ``eager=True`` runs the
    interpreter without ``mx.compile``, evaluating each instruction and freeing
    values after their last use; ``check_numerics=True`` (eager only) raises on
    the first NaN/Inf. ``max_iterations`` is the default loop limit.

    For programs with symbolic dims: ``max_traces`` bounds the number of
    bindings kept compiled (least recently used ones are evicted);
    ``buckets`` pads dims up to bucket sizes (``{"T": "pow2"}`` or
    ``{"T": [128, 512, 2048]}``) so many lengths share few traces — see
    ``docs/symbolic-shapes.md`` for the masking contract. ``fallback="eager"``
    runs a segment that MLX fails to trace eagerly (with a warning, counted in
    ``stats.fallbacks``); ``fallback="raise"`` raises :class:`TraceError`.

    ``native`` lets ops use mlxprog's native CPU kernels where they cover the
    case and the default device is the CPU (see :mod:`mlxprog.native`);
    None takes the default from ``MLXPROG_NATIVE`` (on unless ``0``).
    ``False`` runs MLX's own ops everywhere, for comparison.
    """
    validated = (program if isinstance(program, (ValidatedProgram, SymbolicProgram))
                 else validate(program))
    if check_numerics and not eager:
        raise ProgramError("check_numerics=True needs eager=True (compiled graphs are opaque)")
    if fallback not in ("eager", "raise"):
        raise ProgramError(f"fallback must be 'eager' or 'raise', got {fallback!r}")
    if max_traces < 1:
        raise ProgramError(f"max_traces must be at least 1, got {max_traces}")
    capture_values = bind_captures(validated, captures, weights)
    # Compiled segments close over captures; MLX requires closed-over arrays to
    # be materialised (a lazy one is an "uncaptured input").
    mx.eval(capture_values)
    callbacks = dict(callbacks or {})
    symbolic = isinstance(validated, SymbolicProgram)
    _check_callbacks((validated.sample if symbolic else validated).block, callbacks)
    if native is None:
        native = native_kernels.default_enabled()
    if native and mx.default_device() == mx.cpu and _has_native_kernels(
            (validated.sample if symbolic else validated).block):
        # Build or load the kernels now rather than inside the first trace.
        native_kernels.status()
    options = Options(
        eager, check_numerics, callbacks, max_iterations, fallback, bool(native),
        shared_segments={} if symbolic else None,
        symbolic_locations=validated.symbolic_locations if symbolic else frozenset(),
    )
    return Executable(validated, capture_values, options, max_traces, buckets)


def run(program: Program | ValidatedProgram, *inputs: Any, **compile_kwargs: Any) -> list[mx.array]:
    """Compile ``program`` and call it once: ``run(prog, x, y, captures={...})``."""
    return compile(program, **compile_kwargs)(*inputs)
