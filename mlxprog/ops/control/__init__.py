"""Control flow and callbacks: ``while`` and ``cond`` run their subprograms,
``runtime_call`` calls Python. ``mx.compile`` cannot branch on data or run
Python, so these ops run on the host and end a compiled segment.

Each module holds one host op with all its rules (see :mod:`mlxprog.ops.host`).
"""

from . import cond, runtime_call, while_  # noqa: F401  (register the ops)
