"""A compiled segment: a function of arrays under its own ``mx.compile``,
traced on the first call of each input signature and replayed after."""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Sequence

import mlx.core as mx

from ..errors import ProgramError, TraceError
from .graph import count_nodes
from .options import SegmentStats, Stats


class Segment:
    """``interpret`` (a function of arrays returning a list of arrays) compiled
    once. ``closed_over`` are the arrays it reads without taking them as
    inputs (captures, constants). A trace that fails for a reason validation
    could not see is handled by ``fallback_policy``: ``"eager"`` runs the
    segment uncompiled from then on (with a warning), ``"raise"`` raises
    :class:`~mlxprog.errors.TraceError`. ``reads`` and ``writes`` are the
    environment slots a segment of steps takes and hands on; a ``sync``
    segment runs once the values computed before it are evaluated."""

    def __init__(self, interpret: Callable[..., list], label: str, instructions: int,
                 closed_over: Sequence[Any], fallback_policy: str, stats: Stats,
                 shapeless: bool = False, reads: Sequence[int] = (),
                 writes: Sequence[int] = (), sync: bool = False):
        self.interpret = interpret
        self.reads, self.writes = tuple(reads), tuple(writes)
        self.sync = sync
        self.fallback_policy = fallback_policy
        self.executable_stats = stats
        self.stats = segment_stats = SegmentStats(label, instructions, shapeless=shapeless)

        def segment(*values):
            segment_stats.traces += 1
            return interpret(*values)

        self.compiled = mx.compile(segment, shapeless=shapeless)
        self._closed_over = {id(v) for v in closed_over if v is not None}

    def __call__(self, values: Sequence[mx.array]) -> list[mx.array]:
        # MLX rejects an input that is also a closed-over array (a constant used
        # as a loop's initial carry, say); a fresh wrapper of it is accepted.
        closed_over = self._closed_over
        if not closed_over.isdisjoint(map(id, values)):
            values = [mx.array(v) if id(v) in closed_over else v for v in values]
        stats = self.executable_stats
        before = self.stats.traces
        start = time.perf_counter()
        try:
            out = self.compiled(*values)
        except ProgramError:
            raise
        except Exception as exc:
            if self.stats.traces == before:
                raise
            out = self._fall_back(exc, values)
        if self.stats.traces != before:
            stats.traces += 1
            stats.trace_seconds += time.perf_counter() - start
            if not self.stats.fallback:
                self._count(out, values)
        self.stats.calls += 1
        return out

    def _count(self, out: Sequence[mx.array], values: Sequence[mx.array]) -> None:
        """Count the nodes of the compiled tape just traced: the outputs of
        a call are its replay, so their graph is what every call evaluates."""
        primitives = count_nodes(out, values)
        self.stats.nodes = sum(primitives.values())
        self.stats.primitives = dict(primitives)

    def _fall_back(self, exc: Exception, values: Sequence[mx.array]) -> list:
        where = self.stats.location
        if self.fallback_policy == "raise":
            raise TraceError(f"tracing the segment starting at {where} failed: "
                             f"{type(exc).__name__}: {exc}") from exc
        warnings.warn(f"mlxprog: tracing the segment starting at {where} failed "
                      f"({type(exc).__name__}: {exc}); running it eagerly", RuntimeWarning,
                      stacklevel=5)
        self.compiled = self.interpret
        self.stats.fallback = True
        self.executable_stats.fallbacks += 1
        return self.interpret(*values)
