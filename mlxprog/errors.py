"""Error classes. Every error mlxprog raises derives from :class:`ProgramError`."""

from __future__ import annotations


class ProgramError(Exception):
    """Base class: something about a program, its inputs or its execution failed."""


class FormatError(ProgramError):
    """The program text is not a well-formed mlxprog v1 document (bad JSON, wrong
    format tag, unsupported version, a field of the wrong type)."""


class ValidationError(ProgramError):
    """An instruction of the program is invalid: an unknown op, a bad operand or
    attribute, a ref that points nowhere, or shapes/dtypes that cannot work.

    ``location`` names the instruction (its index and subprogram path), ``op`` the
    op name, ``detail`` what was expected versus found.
    """

    def __init__(self, detail: str, location: str | None = None, op: str | None = None):
        self.detail = detail
        self.location = location
        self.op = op
        where = location or "program"
        if op is not None:
            where = f"{where} ({op})"
        super().__init__(f"{where}: {detail}")


class BindingError(ProgramError):
    """A call-time or compile-time value does not fit the program: a wrong number
    of inputs, an input of the wrong shape or dtype, a missing or mismatched
    capture, a symbolic dimension bound inconsistently."""


class ModelError(ProgramError):
    """A model file or directory cannot be loaded: it is missing, of an
    unsupported type or architecture, or its contents are inconsistent
    (a GGUF file's header, metadata or tensors included)."""


class SettingError(ModelError):
    """A bad value of one of :func:`~mlxprog.llm.load`'s model settings:
    ``setting`` is the parameter's name (``"chat_template"``,
    ``"extra_eos_tokens"``), ``problem`` what is wrong, so that the CLI can
    report it under the flag's name instead."""

    def __init__(self, setting: str, problem: str):
        super().__init__(f"{setting}: {problem}")
        self.setting = setting
        self.problem = problem


class UnboundError(BindingError):
    """A capture or a ``runtime_call`` callback that the program names was not
    given. ``kind`` is ``"capture"`` or ``"callback"`` and ``name`` its name;
    ``problem`` says what is missing and where, and the message adds how to
    give it through the Python API, so a front end with other ways to give it
    (the CLI's ``--weights``) words its own remedy from these fields."""

    def __init__(self, kind: str, name: str, problem: str, remedy: str):
        self.kind = kind
        self.name = name
        self.problem = problem
        super().__init__(f"{problem}: {remedy}")


class CallbackError(ProgramError):
    """A ``runtime_call`` callback failed: it raised (the original exception is
    chained as ``__cause__``) or returned arrays that do not match the declared
    outputs."""


class LoopLimitError(ProgramError):
    """A ``while`` loop ran past its ``max_iterations`` limit or its time limit
    (``Limits.max_loop_seconds``)."""


class EvaluationError(ProgramError):
    """Computing an instruction's values failed in MLX (a linear-algebra
    routine that rejects its input, say). Eager execution names the
    instruction; compiled programs are evaluated by whoever reads their
    outputs, so there the error is MLX's own."""


class NumericError(ProgramError):
    """Eager execution with ``check_numerics`` found a NaN or Inf; the message
    names the first instruction that produced one."""


class TraceError(ProgramError):
    """Tracing a segment under ``mx.compile`` failed and fallback is disabled."""


class UsageError(Exception):
    """A command line is malformed (the CLI's exit status 2): not a
    program's error, so not a :class:`ProgramError`."""
