"""mlxprog: run serialized tensor programs on MLX, compiled once and replayed.

The public API (docs/api.md): a :class:`Program` (loaded from JSON, or
built with a :class:`ProgramBuilder`) is checked by :func:`validate`,
compiled by :func:`compile` into an :class:`Executable` (or run once by
:func:`run`), within :class:`Limits`, with weights from :func:`load_weights`;
every error derives from :class:`ProgramError`; ops are added with
:func:`register_op`, :func:`register_family` and :func:`register_host_op`.

The pipeline, one package each: :mod:`~mlxprog.format` (the program
document) -> :mod:`~mlxprog.validate` (checked and resolved, with
:mod:`~mlxprog.symbolic` dims) -> :mod:`~mlxprog.runtime` (planned into
compiled segments and run); the ops it runs are in :mod:`~mlxprog.ops`.
Everything else lives in its module. See ``docs/`` for the format, the op
reference and guides.
"""

from . import ops  # noqa: F401  (register the built-in ops)
from .builder import ProgramBuilder
from .deprecation import moved_names
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
from .format.program import Program
from .limits import Limits
from .ops.attrs import Attrs, CheckError
from .ops.context import ExecutionContext
from .ops.host import HostOp
from .ops.registry import (
    all_ops,
    lookup,
    register_family,
    register_host_op,
    register_op,
    unregister_op,
)
from .runtime.binding import load_weights
from .runtime.executable import Executable, compile, run
from .validate import validate

__version__ = "0.1.0"

__all__ = [
    # programs
    "Program", "ProgramBuilder", "validate", "compile", "run", "Executable", "Limits",
    "load_weights",
    # errors
    "ProgramError", "FormatError", "ValidationError", "BindingError", "UnboundError",
    "CallbackError", "LoopLimitError", "EvaluationError", "NumericError", "TraceError",
    # ops
    "register_op", "register_family", "register_host_op", "unregister_op", "lookup", "all_ops",
    "Attrs", "CheckError", "HostOp", "ExecutionContext",
]

#: Names this package exported before the public API was narrowed, and the
#: module each lives in now: importing one from here still works, with a
#: DeprecationWarning naming the module (see :mod:`mlxprog.deprecation`).
MOVED = {
    "AVal": "mlxprog.arrays",
    "Value": "mlxprog.builder",
    "Constant": "mlxprog.format.program", "DimSpec": "mlxprog.format.program",
    "Instruction": "mlxprog.format.program", "Ref": "mlxprog.format.program",
    "SubProgram": "mlxprog.format.program", "TensorSpec": "mlxprog.format.program",
    "full_schema": "mlxprog.format.schema",
    "Axes": "mlxprog.ops.attrs", "Axis": "mlxprog.ops.attrs", "DType": "mlxprog.ops.attrs",
    "Float": "mlxprog.ops.attrs", "InsertAxis": "mlxprog.ops.attrs",
    "NoAttrs": "mlxprog.ops.attrs",
    "OpSpec": "mlxprog.ops.registry",
    "StaticExecutable": "mlxprog.runtime.executable",
    "SymbolicExecutable": "mlxprog.runtime.executable",
    "Stats": "mlxprog.runtime.options",
    "SymbolicProgram": "mlxprog.validate", "ValidatedProgram": "mlxprog.validate",
}


__getattr__ = moved_names(__name__, MOVED)
