"""Where an instruction is: its structural path, and the text errors show.

A step path is a tuple alternating instruction indices and subprogram names
from the program body down: ``(3,)`` is instruction 3 of the body, ``(3,
"body", 0)`` is instruction 0 of the ``body`` subprogram of instruction 3.
Everything that needs to know *which* instruction (the symbolic planner, the
shared-segment cache) compares paths; the text is rendered from a path for
messages only.
"""

from __future__ import annotations

StepPath = tuple  # alternating int (instruction index) and str (subprogram name)
"""A structural location: ``(index, name, index, name, ..., index)``."""


def render(path: StepPath) -> str:
    """The text of a path: ``(3, "body", 0)`` -> ``"instruction 3 > body > instruction 0"``;
    a path ending in a subprogram name names that subprogram; ``()`` is the body."""
    return " > ".join(part if isinstance(part, str) else f"instruction {part}" for part in path)


def within(location: str, part: str) -> str:
    """A rendered location extended by one more part (``"instruction 3"`` +
    ``"outputs"``)."""
    return f"{location} > {part}" if location else part
