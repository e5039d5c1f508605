"""Distributed ops: collectives over the process group of a program that
declares ``world_size`` (see ``docs/distributed.md``).

The ops need the group only while they run: the executable makes its group
current (:func:`entered`) around each call, and validation and the builder
make the program's declared world size current (:func:`declaring`) while
they check instructions. Both are context variables set for the duration of
a call, never process-wide state.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator

import mlx.core as mx
from pydantic import Field

from ..arrays import AVal, to_mlx
from ..errors import ProgramError
from .attrs import Attrs, Axis, CheckError, DType, NoAttrs, Size
from .registry import register_family, register_op


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


_group: ContextVar[GroupInfo | None] = ContextVar("mlxprog_group", default=None)
_declared: ContextVar[int | None] = ContextVar("mlxprog_declared_world_size", default=None)


@contextmanager
def _setting(variable: ContextVar, value: Any) -> Iterator[None]:
    """``variable`` set to ``value`` for the duration of the block."""
    token = variable.set(value)
    try:
        yield
    finally:
        variable.reset(token)


def entered(info: GroupInfo | None) -> AbstractContextManager[None]:
    """Make ``info`` the group the distributed ops run on, for the duration
    of the block (an executable's call)."""
    return _setting(_group, info)


def declaring(world_size: int | None) -> AbstractContextManager[None]:
    """Make ``world_size`` the declared world size the distributed ops are
    checked against, for the duration of the block (validating or building
    a program)."""
    return _setting(_declared, world_size)


def current() -> GroupInfo:
    """The group of the executable now running."""
    info = _group.get()
    if info is None:
        # Reached only by calling an op's implementation outside an executable.
        raise ProgramError("a distributed op ran outside an executable with a process group "
                           "(compile the program with mlxprog.compile)")
    return info


def _world_size() -> int:
    """The declared world size of the program being checked."""
    size = _declared.get()
    if size is None:
        raise ValueError("a distributed op needs the program's process group: declare "
                         "world_size in the program (ProgramBuilder(name, world_size=N))")
    return size


def _check_declared(avals: list[AVal], attrs: Attrs) -> None:
    """The program declares its world size."""
    _world_size()


def _same(avals: list[AVal], attrs: Attrs) -> list[AVal]:
    return [avals[0]]


# -- reductions --------------------------------------------------------------

def _reduce(function, operands, attrs):
    info = current()
    if info.size == 1:
        return operands[0]  # one rank: the reduction of one array is itself
    return function(operands[0], group=info.group)


register_family(
    {
        "all_sum": (mx.distributed.all_sum,
                    "The elementwise sum of the operand over every rank of the group "
                    "(every rank gets the same result; same shape and dtype)."),
        "all_max": (mx.distributed.all_max,
                    "The elementwise maximum of the operand over every rank of the group."),
        "all_min": (mx.distributed.all_min,
                    "The elementwise minimum of the operand over every rank of the group."),
    },
    _reduce, attrs=NoAttrs, check=_check_declared, shape_rule=_same, distributed="collective",
)


# -- gather and scatter -------------------------------------------------------

class GatherAttrs(Attrs):
    axis: Axis = 0
    """The axis the ranks' arrays are concatenated along (rank 0's first)."""


def _gather_shape(avals: list[AVal], attrs: GatherAttrs) -> list[AVal]:
    shape = list(avals[0].shape)
    shape[attrs.axis] *= _world_size()
    return [AVal(tuple(shape), avals[0].dtype)]


@register_op("all_gather", attrs=GatherAttrs, check=_check_declared, shape_rule=_gather_shape,
             distributed="collective")
def all_gather(operands, attrs):
    """Every rank's operand concatenated along ``axis`` in rank order: the
    result's ``axis`` is ``world_size`` times longer. Every rank passes the
    same shape; the operand has at least one axis."""
    x, info = operands[0], current()
    if info.size == 1:
        return x
    # MLX gathers along axis 0.
    gathered = mx.distributed.all_gather(mx.moveaxis(x, attrs.axis, 0), group=info.group)
    return mx.moveaxis(gathered, 0, attrs.axis)


class ScatterAttrs(Attrs):
    axis: Axis = 0
    """The axis the sum is split along; its length divides by the world size."""


def _check_scatter(avals: list[AVal], attrs: ScatterAttrs) -> None:
    """The scattered axis divides by the world size."""
    size, length = _world_size(), avals[0].shape[attrs.axis]
    if length % size:
        raise CheckError(f"axis {attrs.axis} has length {length}, which does not divide by "
                         f"the world size {size}", attribute="axis")


def _scatter_shape(avals: list[AVal], attrs: ScatterAttrs) -> list[AVal]:
    shape = list(avals[0].shape)
    shape[attrs.axis] //= _world_size()
    return [AVal(tuple(shape), avals[0].dtype)]


@register_op("sum_scatter", attrs=ScatterAttrs, check=_check_scatter,
             shape_rule=_scatter_shape, distributed="collective")
def sum_scatter(operands, attrs):
    """This rank's slice of the elementwise sum over every rank: the sum is
    split along ``axis`` into ``world_size`` equal parts and rank ``r`` gets
    part ``r``. On the CPU (whose ring backend has no ``sum_scatter``) it is
    computed as ``all_sum`` and a slice."""
    x, info = operands[0], current()
    if info.size == 1:
        return x
    if mx.default_device() == mx.cpu:
        part = x.shape[attrs.axis] // info.size
        total = mx.distributed.all_sum(x, group=info.group)
        index = [slice(None)] * x.ndim
        index[attrs.axis] = slice(info.rank * part, (info.rank + 1) * part)
        return total[tuple(index)]
    # MLX scatters along axis 0.
    moved = mx.distributed.sum_scatter(mx.moveaxis(x, attrs.axis, 0), group=info.group)
    return mx.moveaxis(moved, 0, attrs.axis)


# -- point to point ------------------------------------------------------------

def _check_peer(rank: int, what: str) -> None:
    """``rank`` (attribute ``what``) is a rank of a group of at least 2."""
    size = _world_size()
    if size < 2:
        raise ValueError(f"needs world_size of at least 2; the program declares {size}")
    if rank >= size:
        raise CheckError(f"rank {rank} is not in a group of world size {size}",
                         attribute=what)


def _group_check_peer(rank: int, what: str, info: GroupInfo) -> None:
    """``rank`` is another rank this rank can reach on the group's backend."""
    if rank == info.rank:
        raise ValueError(f"attribute {what!r}: rank {rank} is this rank")
    neighbours = {(info.rank + 1) % info.size, (info.rank - 1) % info.size}
    if info.ring and rank not in neighbours:
        raise ValueError(f"attribute {what!r}: the ring backend reaches only the neighbouring "
                         f"ranks {sorted(neighbours)} of rank {info.rank}; found {rank}")


class SendAttrs(Attrs):
    dst: int = Field(ge=0)
    """The rank the operand is sent to."""


@register_op("send", attrs=SendAttrs, check=lambda avals, attrs: _check_peer(attrs.dst, "dst"),
             shape_rule=_same, distributed="point_to_point", keep=True,
             group_check=lambda attrs, info: _group_check_peer(attrs.dst, "dst", info))
def send(operands, attrs):
    """Send the operand to rank ``dst``, which runs a matching ``recv``; the
    result is the sent array. The send happens even when nothing reads the
    result (the runtime ties it to its block's outputs). On the ring backend
    ``dst`` is a neighbouring rank."""
    info = current()
    return mx.distributed.send(operands[0], attrs.dst, group=info.group)


class RecvAttrs(Attrs):
    shape: list[Size]
    """The shape of the array received."""
    dtype: DType
    """The dtype of the array received."""
    src: int = Field(ge=0)
    """The rank it is received from."""


def _recv_shape(avals: list[AVal], attrs: RecvAttrs) -> list[AVal]:
    return [AVal(tuple(attrs.shape), to_mlx(attrs.dtype))]


@register_op("recv", attrs=RecvAttrs, operands=0, shape_rule=_recv_shape,
             check=lambda avals, attrs: _check_peer(attrs.src, "src"),
             distributed="point_to_point",
             group_check=lambda attrs, info: _group_check_peer(attrs.src, "src", info))
def recv(operands, attrs):
    """An array of ``shape`` and ``dtype`` received from rank ``src``, which
    runs a matching ``send`` of that shape and dtype. On the ring backend
    ``src`` is a neighbouring rank."""
    info = current()
    return mx.distributed.recv(attrs.shape, to_mlx(attrs.dtype), attrs.src, group=info.group)


# -- the group -------------------------------------------------------------------

def _scalar(avals: list[AVal], attrs: Attrs) -> list[AVal]:
    return [AVal((), mx.int32)]


@register_op("rank", operands=0, check=_check_declared, shape_rule=_scalar,
             distributed="group")
def rank(operands, attrs):
    """This process's rank in the group (an int32 scalar, 0 to ``world_size - 1``)."""
    return mx.array(current().rank, dtype=mx.int32)


@register_op("world_size", operands=0, check=_check_declared, shape_rule=_scalar,
             distributed="group")
def world_size(operands, attrs):
    """The number of ranks in the group (an int32 scalar)."""
    return mx.array(current().size, dtype=mx.int32)
