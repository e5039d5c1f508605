"""What an Executable is told (:class:`Options`) and what it counts (:class:`Stats`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..limits import Limits

DEFAULT_MAX_ITERATIONS = 1_000_000
DEFAULT_MAX_TRACES = 16


@dataclass(frozen=True)
class Options:
    """Execution options shared by every block of an Executable (see
    :func:`mlxprog.compile` for each)."""

    eager: bool = False
    check_numerics: bool = False
    callbacks: Mapping[str, Callable] = field(default_factory=dict)
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    fallback: str = "eager"
    native: bool = True
    max_loop_seconds: float = Limits.max_loop_seconds
    """The time one run of a loop may take (the program's
    ``Limits.max_loop_seconds``)."""


@dataclass
class SegmentStats:
    """Counters of one compiled segment. ``shapeless`` segments serve every
    binding of a symbolic program with one trace; ``fallback`` ones failed to
    trace and run eagerly. ``nodes`` is the number of MLX primitives a call
    evaluates, counted on the compiled tape of the last trace (after
    ``mx.compile``'s simplification and fusion; see
    :func:`mlxprog.runtime.graph.count_nodes`), and ``primitives`` the same
    by primitive name; None and empty before the first trace and when the
    segment runs eagerly."""

    location: str
    instructions: int
    traces: int = 0
    calls: int = 0
    shapeless: bool = False
    fallback: bool = False
    nodes: int | None = None
    primitives: dict[str, int] = field(default_factory=dict)


@dataclass
class Stats:
    """What an Executable has done: calls, traces, time spent tracing, the shape
    of its plan, and (symbolic programs) its trace cache. ``native`` says
    whether native CPU kernels were allowed; ``native_ops`` counts, by op, the
    instructions that took one (once per trace when compiled, once per call
    when eager); ``numerics_fallbacks`` counts, by (op, reason), those that
    asked for numerics no kernel here honours (``quantized_matmul``'s
    ``"int8"`` off the CPU, say) and computed exactly instead.
    ``segments[i].nodes`` (``segment_nodes`` in :meth:`as_dict`) is the
    number of MLX nodes a call of segment i evaluates, counted when it is
    traced. ``exe.stats`` is live; ``exe.stats.as_dict()`` snapshots it."""

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
    numerics_fallbacks: dict[tuple[str, str], int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The counters as plain data."""
        return {
            "calls": self.calls,
            "traces": self.traces,
            "trace_seconds": round(self.trace_seconds, 6),
            "instructions": self.instructions,
            "segments": len(self.segments),
            "segment_traces": [s.traces for s in self.segments],
            "segment_nodes": [s.nodes for s in self.segments],
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
            "numerics_fallbacks": [{"op": op, "reason": reason, "count": count}
                                   for (op, reason), count in self.numerics_fallbacks.items()],
        }

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.as_dict().items())
