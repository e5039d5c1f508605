"""mlxprog: run serialized tensor programs on MLX, compiled once and replayed.

The pipeline, one package each: :mod:`~mlxprog.format` (the program
document) -> :mod:`~mlxprog.validate` (checked and resolved, with
:mod:`~mlxprog.symbolic` dims) -> :mod:`~mlxprog.runtime` (planned into
compiled segments and run); the ops it runs are in :mod:`~mlxprog.ops`.
See ``docs/`` for the format, the op reference and guides.
"""

from . import ops  # noqa: F401  (register the built-in ops)
from .arrays import AVal
from .builder import ProgramBuilder, Value
from .errors import (
    BindingError,
    CallbackError,
    EvaluationError,
    FormatError,
    LoopLimitError,
    NumericError,
    ProgramError,
    TraceError,
    UnboundError,
    ValidationError,
)
from .format.program import Constant, DimSpec, Instruction, Program, Ref, SubProgram, TensorSpec
from .format.schema import full_schema
from .limits import Limits
from .ops.attrs import Attrs, Axes, Axis, CheckError, DType, Float, InsertAxis, NoAttrs
from .ops.context import ExecutionContext
from .ops.host import HostOp
from .ops.registry import (
    OpSpec,
    all_ops,
    lookup,
    register_family,
    register_host_op,
    register_op,
    unregister_op,
)
from .runtime.binding import load_weights
from .runtime.executable import (
    Executable,
    StaticExecutable,
    SymbolicExecutable,
    compile,
    run,
)
from .runtime.options import Stats
from .validate import SymbolicProgram, ValidatedProgram, validate

__version__ = "0.1.0"

__all__ = [
    "Attrs", "AVal", "Axes", "Axis", "BindingError", "CallbackError", "CheckError", "Constant",
    "DimSpec", "DType", "EvaluationError", "Executable", "ExecutionContext", "Float",
    "FormatError", "HostOp", "InsertAxis", "Instruction", "Limits", "LoopLimitError", "NoAttrs",
    "NumericError", "OpSpec", "Program", "ProgramBuilder", "ProgramError", "Ref",
    "StaticExecutable", "Stats", "SubProgram", "SymbolicExecutable", "SymbolicProgram",
    "TensorSpec", "TraceError", "UnboundError", "ValidatedProgram", "ValidationError", "Value",
    "all_ops", "compile", "full_schema", "load_weights", "lookup", "register_family",
    "register_host_op", "register_op", "run", "unregister_op", "validate",
]
