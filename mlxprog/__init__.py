"""mlxprog: run serialized tensor programs on MLX, compiled once and replayed.

See ``docs/`` for the format, the op reference and guides.
"""

from . import control, ops  # noqa: F401  (register the built-in ops)
from .attrs import Attrs, NoAttrs
from .builder import ProgramBuilder, Value
from .errors import (
    BindingError,
    CallbackError,
    FormatError,
    LoopLimitError,
    NumericError,
    ProgramError,
    TraceError,
    ValidationError,
)
from .executable import Executable, Stats, compile, load_weights, run
from .program import Constant, Instruction, Program, Ref, SubProgram, TensorSpec
from .registry import AVal, OpSpec, all_ops, lookup, register_op, unregister_op
from .schema import full_schema
from .symbolic import SymbolicProgram
from .validate import ValidatedProgram, validate

__version__ = "0.1.0"

__all__ = [
    "AVal", "Attrs", "BindingError", "CallbackError", "Constant", "Executable",
    "FormatError", "Instruction", "LoopLimitError", "NoAttrs", "NumericError", "OpSpec",
    "Program", "ProgramBuilder", "ProgramError", "Ref", "Stats", "SubProgram",
    "TensorSpec", "TraceError", "ValidatedProgram", "ValidationError", "Value",
    "SymbolicProgram", "all_ops", "compile", "full_schema", "load_weights", "lookup", "register_op", "run",
    "unregister_op", "validate",
]
