"""Executables: a validated program with its captures bound, called like a
function. :func:`compile` builds one; a static program gets a
:class:`StaticExecutable` (one runner), a program with symbolic dims a
:class:`SymbolicExecutable` (a runner per binding of its dims, cached).
Each holds the :class:`~mlxprog.ops.context.ExecutionContext` its ops are
given (its group, native-kernel setting and callbacks).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import mlx.core as mx

from .. import native as native_kernels
from ..arrays import AVal, to_mlx
from ..errors import BindingError, ProgramError
from ..format.program import Program
from ..limits import Limits
from ..ops.context import ExecutionContext, GroupInfo
from ..symbolic import binding as dim_binding
from ..symbolic.cache import SpecializationCache
from ..validate import SymbolicProgram, ValidatedProgram, validate
from ..validate.steps import Block
from . import distributed
from .binding import bind_captures, bind_input
from .options import DEFAULT_MAX_ITERATIONS, DEFAULT_MAX_TRACES, Options, Stats
from .runner import BlockRunner, RunContext

_MAX_REMEMBERED_SHAPES = 256  # input-shape tuples whose dim binding is kept


class Executable:
    """A compiled program: call it with the program's inputs, get its outputs.

    Build one with :func:`mlxprog.compile`. Inputs may be ``mx.array``, numpy
    arrays or Python scalars/lists, positionally or by input name; they are
    checked against the input specs. Outputs are a list of (lazy) ``mx.array``.
    """

    def __init__(self, validated: ValidatedProgram | SymbolicProgram,
                 capture_values: Sequence[mx.array], options: Options,
                 group: GroupInfo | None = None):
        self.validated = validated
        self.program = validated.program
        self.options = options
        self.stats = Stats(eager=options.eager, native=options.native)
        #: What its ops are given; the native kernels count into the stats.
        self.context = ExecutionContext(
            world_size=self.program.world_size, group=group,
            native=native_kernels.Setting(options.native, self.stats.native_ops,
                                          self.stats.numerics_fallbacks),
            callbacks=options.callbacks)
        self._captures = list(capture_values)
        self._input_names = [s.name for s in self.program.inputs if s.value_of is None]

    @property
    def input_names(self) -> list[str]:
        """Names of the inputs a caller passes, in call order."""
        return list(self._input_names)

    @property
    def group(self) -> mx.distributed.Group | None:
        """The process group the program runs on (None: it declares no world_size)."""
        info = self.context.group
        return None if info is None else info.group

    @property
    def rank(self) -> int:
        """This process's rank in the group (0 without one)."""
        info = self.context.group
        return 0 if info is None else info.rank

    @property
    def world_size(self) -> int:
        """The number of ranks in the group (1 without one)."""
        info = self.context.group
        return 1 if info is None else info.size

    def __call__(self, *args: Any, **kwargs: Any) -> list[mx.array]:
        return self._call(self._arguments(args, kwargs), self.context)

    def with_callbacks(self, callbacks: Mapping[str, Callable]) -> Callable[..., list[mx.array]]:
        """A function that calls this executable (with its inputs, as the
        executable takes them) whose ``runtime_call`` steps call
        ``callbacks`` by name instead of the ones given to ``compile``
        (those not named here stay). It shares everything else: compiled
        segments, caches and stats. A program compiled once can so stream
        each caller's results to a callback of its own (the LLM's decode
        loop does: one per generation)."""
        for name, callback in callbacks.items():
            if not callable(callback):
                raise BindingError(f"callback {name!r} must be callable, got "
                                   f"{type(callback).__name__}")
        context = dataclasses.replace(self.context,
                                      callbacks={**self.context.callbacks, **callbacks})
        return lambda *args, **kwargs: self._call(self._arguments(args, kwargs), context)

    def _call(self, args: Sequence[Any], context: ExecutionContext) -> list[mx.array]:
        """Run the program on the call's inputs (in program order) in ``context``."""
        raise NotImplementedError

    def _arguments(self, args: tuple, kwargs: dict) -> tuple:
        """The call's inputs in program order, from positional and keyword arguments."""
        names = self._input_names
        if kwargs:
            merged = list(args)
            for name in names[len(args):]:
                if name not in kwargs:
                    raise BindingError(f"missing input {name!r}")
                merged.append(kwargs.pop(name))
            if kwargs:
                unknown = ", ".join(repr(k) for k in kwargs)
                raise BindingError(f"unknown or repeated input(s) {unknown}; inputs are {names}")
            args = tuple(merged)
        if len(args) != len(names):
            raise BindingError(
                f"program {self.program.name or '<unnamed>'} takes {len(names)} input(s) "
                f"({', '.join(names) or 'none'}), got {len(args)}"
            )
        return args

    def _runner(self, validated: ValidatedProgram, context: RunContext) -> BlockRunner:
        fixed = [None] * len(validated.input_avals) + [*self._captures, *validated.constants]
        mx.eval(validated.constants)
        return BlockRunner(validated.block, len(validated.input_avals), fixed, context)


class StaticExecutable(Executable):
    """An Executable of a program without symbolic dims: one runner."""

    def __init__(self, validated: ValidatedProgram, capture_values: Sequence[mx.array],
                 options: Options, group: GroupInfo | None = None):
        super().__init__(validated, capture_values, options, group)
        self._input_avals = validated.input_avals
        self._body = self._runner(validated, RunContext(options, self.stats, self.context))
        self.stats.segments.extend(s.stats for s in self._body.segments)
        self.stats.instructions = validated.block.instruction_count()

    @property
    def out_avals(self) -> list[AVal]:
        """Shapes and dtypes of the outputs."""
        return self.validated.out_avals

    def _call(self, args: Sequence[Any], context: ExecutionContext) -> list[mx.array]:
        values = [bind_input(name, value, aval.dtype, aval.shape)
                  for name, aval, value in zip(self._input_names, self._input_avals, args)]
        self.stats.calls += 1
        return self._body.run(values, (), context)


class SymbolicExecutable(Executable):
    """An Executable of a program with symbolic dims. Each call binds the dims
    from the input shapes and runs the program specialised to that binding; an
    LRU cache keeps ``max_traces`` specialisations. Segments made only of
    shape-polymorphic ops are compiled shapeless and shared by every binding;
    ``buckets`` pads dims up to bucket sizes so many lengths share few traces."""

    def __init__(self, validated: SymbolicProgram, capture_values: Sequence[mx.array],
                 options: Options, max_traces: int = DEFAULT_MAX_TRACES,
                 buckets: Mapping[str, str | Sequence[int]] | None = None,
                 group: GroupInfo | None = None):
        super().__init__(validated, capture_values, options, group)
        specs = self.program.inputs
        self._buckets = dim_binding.check_buckets(buckets or {}, validated.dims)
        self._cache: SpecializationCache[BlockRunner] = SpecializationCache(max_traces)
        self._shared: dict = {}  # shapeless segments, by their first and last step paths
        self._input_dtypes = [to_mlx(s.dtype) for s in specs if s.value_of is None]
        self._declared = [shape for shape, s in zip(validated.input_shapes, specs)
                          if s.value_of is None]
        self._value_of = [None if s.value_of is None else (s.value_of, to_mlx(s.dtype))
                          for s in specs]
        self._bindings_of: dict[tuple, dict[str, int]] = {}  # input shapes -> dims
        self.stats.instructions = validated.sample.block.instruction_count()

    @property
    def out_avals(self) -> list[AVal]:
        """Not available: a symbolic program's output shapes depend on its dims."""
        raise ProgramError("a symbolic program's output shapes depend on its dims; "
                           "see exe.validated.describe_outputs()")

    def _call(self, args: Sequence[Any], context: ExecutionContext) -> list[mx.array]:
        names = self._input_names
        values = [bind_input(name, value, dtype, None)
                  for name, dtype, value in zip(names, self._input_dtypes, args)]
        shapes = tuple(tuple(v.shape) for v in values)
        bindings = self._bindings_of.get(shapes)
        if bindings is None:
            # Solving the dims takes a Python pass over every input axis; a
            # decode loop calls with the same shapes again and again.
            bindings = dim_binding.bind_dims(
                [(n, list(d), s) for n, d, s in zip(names, self._declared, shapes)],
                self.validated.dims,
            )
            if len(self._bindings_of) >= _MAX_REMEMBERED_SHAPES:
                self._bindings_of.pop(next(iter(self._bindings_of)))
            self._bindings_of[shapes] = bindings
        run_bindings = {d: dim_binding.bucket(v, self._buckets[d], self.validated.dims[d])
                        if d in self._buckets else v for d, v in bindings.items()}
        padded = run_bindings != bindings
        if padded:
            values = [dim_binding.pad(v, declared, run_bindings)
                      for v, declared in zip(values, self._declared)]
        runner = self._specialization(run_bindings)
        given = iter(values)
        inputs = [next(given) if dim is None else mx.array(bindings[dim[0]], dtype=dim[1])
                  for dim in self._value_of]
        self.stats.calls += 1
        outputs = runner.run(inputs, (), context)
        if padded:
            outputs = [dim_binding.unpad(o, shape, bindings)
                       for o, shape in zip(outputs, self.validated.out_shapes)]
        return outputs

    def _specialization(self, bindings: dict[str, int]) -> BlockRunner:
        """The runner for one binding, from the cache or built (and counted)."""
        def build() -> BlockRunner:
            # MLX 0.32's shapeless compilation crashes the process when an axis
            # it reduces has size 1, and a trace of an empty array can drop
            # the ops (softmax of nothing traces as the identity), so bindings
            # with a 0 or 1 get traces of their own.
            shared = None if {0, 1} & set(bindings.values()) else self._shared
            context = RunContext(self.options, self.stats, self.context,
                                 self.validated.dim_dependent, shared)
            return self._runner(self.validated.specialize(bindings), context)

        misses = self._cache.misses
        runner = self._cache.get(bindings, build)
        stats = self.stats
        stats.cache_hits, stats.cache_misses = self._cache.hits, self._cache.misses
        stats.cache_evictions = self._cache.evictions
        if self._cache.misses != misses:
            # A new specialisation: its segments join the stats (shared ones
            # once) and those of an evicted one leave.
            stats.segments = list({id(s): s.stats for r in self._cache.values()
                                   for s in r.segments}.values())
            stats.bindings = self._cache.bindings()
        return runner


def compile(program: Program | ValidatedProgram | SymbolicProgram,
            captures: Mapping[str, Any] | None = None,
            weights: str | Path | Sequence[str | Path] | None = None,
            callbacks: Mapping[str, Callable] | None = None, eager: bool = False,
            check_numerics: bool = False, max_iterations: int = DEFAULT_MAX_ITERATIONS,
            max_traces: int = DEFAULT_MAX_TRACES,
            buckets: Mapping[str, str | Sequence[int]] | None = None,
            fallback: str = "eager", native: bool | None = None,
            limits: Limits | None = None,
            group: mx.distributed.Group | None = None) -> Executable:
    """Validate a program, bind its captures and return an :class:`Executable`.

    ``captures`` maps capture names to arrays; ``weights`` names files read with
    ``mx.load`` (``.gguf`` with mlxprog's own reader; both may be given;
    ``captures`` wins). ``callbacks`` maps the
    names used by ``runtime_call`` to Python callables
    (:meth:`Executable.with_callbacks` replaces them for some calls).
    ``eager=True`` runs the interpreter without ``mx.compile``, evaluating
    each instruction and freeing values after their last use;
    ``check_numerics=True`` (eager only) raises on the first NaN/Inf.
    ``max_iterations`` is the default loop limit.

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

    ``limits`` (a :class:`~mlxprog.limits.Limits`; default sized from the
    machine's memory) bounds what the program may ask for: result sizes,
    results per instruction, nesting, instructions; a symbolic program is held
    to them for every binding, before it runs; and how long a loop may run. A
    program given already validated keeps the limits it was validated under.

    ``group`` is the ``mx.distributed.Group`` a program that declares
    ``world_size`` runs on (default ``mx.distributed.init()``); its size must
    be the declared one. Every rank then compares a digest of its program's
    collectives with the others' (this call waits for every rank to compile)
    and raises :class:`ProgramError` when they differ — see
    ``docs/distributed.md``.
    """
    validated = (program if isinstance(program, (ValidatedProgram, SymbolicProgram))
                 else validate(program, limits))
    if check_numerics and not eager:
        raise ProgramError("check_numerics=True needs eager=True (compiled graphs are opaque)")
    if fallback not in ("eager", "raise"):
        raise ProgramError(f"fallback must be 'eager' or 'raise', got {fallback!r}")
    if max_traces < 1:
        raise ProgramError(f"max_traces must be at least 1, got {max_traces}")
    symbolic = isinstance(validated, SymbolicProgram)
    if buckets and not symbolic:
        raise BindingError("buckets= needs a program with symbolic dims")
    capture_values = bind_captures(validated.program.captures, validated.capture_avals,
                                   captures, weights)
    # Compiled segments close over captures; MLX requires closed-over arrays to
    # be materialised (a lazy one is an "uncaptured input").
    mx.eval(capture_values)
    if native is None:
        native = native_kernels.default_enabled()
    # Every rank of a distributed program must leave a loop at the same
    # iteration (its collectives wait for one another), which a clock cannot
    # promise: such loops are bounded by the count alone.
    loop_seconds = (math.inf if (validated.program.world_size or 1) > 1
                    else (validated.limits or Limits()).max_loop_seconds)
    options = Options(eager, check_numerics, dict(callbacks or {}), max_iterations, fallback,
                      bool(native), loop_seconds)
    body = (validated.sample if symbolic else validated).block
    _check_options(body, options)
    if options.native and mx.default_device() == mx.cpu and any(
            step.spec.native_coverage is not None for step in body.walk()):
        # Build or load the kernels now rather than inside the first trace.
        native_kernels.status()
    group_info = distributed.setup(validated.program, body, group)
    if symbolic:
        return SymbolicExecutable(validated, capture_values, options, max_traces, buckets,
                                  group_info)
    return StaticExecutable(validated, capture_values, options, group_info)


def _check_options(block: Block, options: Options) -> None:
    """Let every host step check that the options can run it."""
    for step in block.walk():
        if step.spec.host is not None:
            step.spec.host.check_options(step, options)


def run(program: Program | ValidatedProgram, *inputs: Any, **compile_kwargs: Any) -> list[mx.array]:
    """Compile ``program`` and call it once: ``run(prog, x, y, captures={...})``."""
    return compile(program, **compile_kwargs)(*inputs)
