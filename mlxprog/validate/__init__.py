"""Validation: a :class:`~mlxprog.format.program.Program` checked completely
and resolved for execution.

- :mod:`.steps`: what validation produces (``Step``, ``Block``,
  ``ValidatedProgram``);
- :mod:`.block`: one instruction list: refs, ops, attributes, operand checks,
  shape inference;
- :mod:`.program`: static programs; :mod:`.symbolic`: programs with dims.
"""

from __future__ import annotations

from ..format.program import Program, gc_paused
from ..limits import Limits
from .program import validate_static
from .steps import Block, Step, ValidatedProgram
from .symbolic import SymbolicProgram, is_symbolic, validate_symbolic

__all__ = ["Block", "Step", "SymbolicProgram", "ValidatedProgram", "validate",
           "validate_static", "validate_symbolic"]


def validate(program: Program, limits: Limits | None = None) -> ValidatedProgram | SymbolicProgram:
    """Check a program completely and resolve it for execution, held to
    ``limits`` (default: :class:`~mlxprog.limits.Limits`, sized from the
    machine's memory).

    Returns a :class:`ValidatedProgram`, or for a program with symbolic dims a
    :class:`SymbolicProgram`. Raises :class:`~mlxprog.errors.ValidationError`
    on the first problem, naming where it is.
    """
    with gc_paused():
        if is_symbolic(program):
            return validate_symbolic(program, limits)
        return validate_static(program, limits)
