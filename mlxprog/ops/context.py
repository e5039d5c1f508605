"""What an op may need besides its operands and attributes: the
:class:`ExecutionContext`, passed as an argument to the ops registered with
``context=True`` (see :func:`~mlxprog.ops.registry.register_op`), never read
from ambient state.

An executable builds its context once, at compile: the process group, the
native-kernel setting and the callbacks. Its compiled segments close over
that context, and an op's implementation runs only while a segment is
traced (``mx.compile`` replays the traced graph after), so what the op
reads of it is fixed in the trace and a replay costs nothing more. Host
steps (``runtime_call``) are given the context of each call, whose
callbacks :meth:`~mlxprog.runtime.executable.Executable.with_callbacks` may
replace for that call. Validation gives the ops a context that holds only
the program's declared world size (no group yet, native kernels off),
which the distributed ops' rules check against.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..native import Setting as NativeSetting


@dataclass(frozen=True)
class GroupInfo:
    """The process group an executable runs on: the ``mx.distributed.Group``,
    this process's rank, the group's size, and whether the backend is MLX's
    ring (whose ``send``/``recv`` reach only the neighbouring ranks and which
    has no ``sum_scatter``)."""

    group: Any
    rank: int
    size: int
    ring: bool

    @classmethod
    def of(cls, group: Any) -> GroupInfo:
        """The info of an ``mx.distributed.Group``. The ring backend is
        recognised by the hostfile that ``mlx.launch --backend ring`` hands
        its ranks (the other launchers set variables of their own)."""
        env = os.environ
        ring = bool(env.get("MLX_HOSTFILE")) and not env.get("MLX_IBV_DEVICES") \
            and not env.get("NCCL_HOST_IP")
        return cls(group, group.rank(), group.size(), ring)


@dataclass(frozen=True, eq=False)
class ExecutionContext:
    """What the ops of one executable (or of one program being validated)
    are given besides their operands and attributes.

    ``world_size`` is the program's declared world size (None: it declares
    none, and uses no distributed op); ``group`` the process group it runs
    on (None while it is validated, and without a declared world size).
    ``native`` is the executable's native-kernel setting, with the counters
    of the kernels taken (off while validating). ``callbacks`` are the
    Python functions its ``runtime_call`` steps call, by name.
    """

    world_size: int | None = None
    group: GroupInfo | None = None
    native: NativeSetting = field(default_factory=lambda: NativeSetting(False))
    callbacks: Mapping[str, Callable] = field(default_factory=dict)
