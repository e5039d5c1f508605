"""What a fuzz run passes around: a :class:`Case` (a program text and how to
call it) and the :class:`Outcome` of running one.

Outcome classes:

========================  ================================================
``ok``                    ran; compiled and eager agreed (and matched any
                          expected outputs)
``program-error``         rejected with a ``mlxprog.ProgramError``: expected
``other-exception``       any other exception escaped (a bug), or a
                          ProgramError wrapping an internal failure
``crash``                 the process died: a signal, or it exited without
                          reporting
``hang``                  no report within the timeout
``mismatch``              compiled and eager differ (values, NaN positions,
                          dtype, shape, or one raised and the other did not),
                          or the outputs differ from the case's expected ones
                          or from the numpy reference of their op
``memory``                MemoryError or an allocation failure
``coercion``              a value was silently changed: a wrong JSON type,
                          a duplicate key or a non-finite literal accepted,
                          a constant or input not passed through exactly, a
                          mismatched call input accepted
========================  ================================================
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

OUTCOMES = ("ok", "program-error", "other-exception", "crash", "hang", "mismatch", "memory",
            "coercion")
BUG_CLASSES = frozenset(OUTCOMES) - {"ok", "program-error"}


@dataclass
class Case:
    """A program text with how to run it.

    ``seed`` drives the worker's random inputs. ``options`` (all optional):
    ``inputs`` (explicit call inputs, as JSON values; ``{"zeros": shape}``
    for a zero-size one, ``{"full": shape, "value": v}`` for a large one of
    one value), ``input_sets`` (a list of them, called in turn),
    ``outputs`` (the expected outputs of the call with ``inputs``, or of a
    program without inputs; written as inputs are), ``output_sets`` (the
    expected outputs of each of ``input_sets``), ``input_form`` (``"mx"``,
    ``"numpy"`` or ``"list"``: how inputs are passed), ``calls`` (compiled
    calls per binding, default 3), ``eager`` (false: skip the eager run),
    ``compile`` (extra ``mlxprog.compile`` keywords, e.g.
    ``{"max_iterations": 10}``), ``bad_calls`` (false: skip the calls with
    mismatched inputs), ``timeout`` (seconds, for a slow case),
    ``memory_limit`` (bytes: the case needs a worker with this limit).
    """

    text: str
    kind: str = "manual"
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Case:
        """A case from its saved form; ``program`` (a JSON object) may stand
        in for ``text``."""
        data = dict(data)
        if "program" in data:
            data["text"] = json.dumps(data.pop("program"))
        known = {k: data[k] for k in ("text", "kind", "seed", "options", "note") if k in data}
        return cls(**known)


@dataclass
class Outcome:
    """The result of running a case: its class, the stage it reached
    (``load``, ``validate``, ``compile``, ``call``, ``bad-call``, ...) and
    the error or difference, as text."""

    cls: str
    stage: str = ""
    error: str = ""
    stderr: str = ""
    reproducible: bool | None = None

    @property
    def is_bug(self) -> bool:
        return self.cls in BUG_CLASSES

    @property
    def signature(self) -> tuple[str, str, str]:
        """What must stay the same while a program is minimised: the class,
        the stage and, for an exception or a crash, its type or signal."""
        kind = self.error.split(":", 1)[0] if self.cls in (
            "other-exception", "memory", "crash") else ""
        return self.cls, self.stage, kind

    def describe(self) -> str:
        text = f"{self.cls} at {self.stage or '?'}"
        if self.error:
            text += f": {self.error}"
        if self.stderr:
            text += f"\n--- stderr tail ---\n{self.stderr}"
        if self.reproducible is False:
            text += "\n(did not reproduce alone in a fresh process: depends on earlier programs)"
        return text
