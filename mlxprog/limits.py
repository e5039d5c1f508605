"""Resource limits: how large a program may be and how much it may ask for.

A program from any emitter either runs or fails with a
:class:`~mlxprog.errors.ProgramError`; it must never exhaust the process.
Validation checks every limit where sizes are known (the result of every
instruction, after shape inference on lazy placeholders that allocate
nothing), so a program that asks too much is rejected before anything is
allocated; a symbolic program is checked again for each binding of its dims,
when it is specialised and before it runs. ``mp.validate(program,
limits=...)`` and ``mp.compile(..., limits=...)`` take a :class:`Limits`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .errors import ProgramError

try:
    import resource
except ImportError:  # not on every platform
    resource = None

MAX_DIM = 2**31 - 1
"""The largest size of one axis (MLX stores sizes as 32-bit integers)."""


def memory_bytes() -> int:
    """The memory this process may use: the machine's physical memory (8 GiB
    where it cannot be read), or less where an address-space or data-size
    limit (``ulimit -v``, ``-d``) says so."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 8 * 2**30
    if resource is None:
        return memory
    for kind in (resource.RLIMIT_AS, getattr(resource, "RLIMIT_DATA", resource.RLIMIT_AS)):
        soft, _ = resource.getrlimit(kind)
        if soft != resource.RLIM_INFINITY and soft > 0:
            memory = min(memory, soft)
    return memory


def _default_max_elements() -> int:
    # One result of the widest dtype (8 bytes) may take up to half the memory.
    return memory_bytes() // 16


def _default_max_total_elements() -> int:
    # All results together, at 4 bytes each, may take up to twice the memory
    # (compiled segments never hold every intermediate at once).
    return memory_bytes() // 2


@dataclass(frozen=True)
class Limits:
    """The limits validation enforces (see the module docstring).

    ``max_elements``: elements of any one result; ``max_total_elements``: of
    all results of the program together (each subprogram counted once);
    defaults derive from the machine's memory. ``max_results``: results of one
    instruction. ``max_depth``: nesting of subprograms. ``max_instructions``:
    instructions in the program, subprograms included. ``max_loop_seconds``:
    the time one run of a ``while`` may take (``math.inf``: no bound), checked
    at run time after each iteration; it stops a runaway loop long before
    the iteration limit, which is ``mlxprog.compile``'s ``max_iterations`` (a
    ``while``'s own ``max_iterations`` can only lower it). A program with a
    ``world_size`` above 1 has its loops bounded by the count alone: every
    rank must stop at the same iteration.
    """

    max_elements: int = field(default_factory=_default_max_elements)
    max_total_elements: int = field(default_factory=_default_max_total_elements)
    max_results: int = 4096
    max_depth: int = 32
    max_instructions: int = 10_000_000
    max_loop_seconds: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_elements", "max_total_elements", "max_results", "max_depth",
                     "max_instructions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProgramError(f"Limits.{name} must be a positive integer, got {value!r}")
        seconds = self.max_loop_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
            raise ProgramError(f"Limits.max_loop_seconds must be a positive number, "
                               f"got {seconds!r}")
