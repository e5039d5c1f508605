"""Distributed ops: collectives over the process group of a program that
declares ``world_size`` (see ``docs/distributed.md``).

Every op here is registered with ``context=True``: its rules get the
program's declared world size, and its implementation the executable's
group, from the :class:`~mlxprog.ops.context.ExecutionContext` passed to
them (validation's, then the executable's, fixed in each trace).
"""

from __future__ import annotations

import mlx.core as mx
from pydantic import Field

from ..arrays import AVal, to_mlx
from ..errors import ProgramError
from .attrs import Attrs, Axis, CheckError, DType, NoAttrs, Size
from .context import ExecutionContext, GroupInfo
from .registry import register_family, register_op


def _group(context: ExecutionContext) -> GroupInfo:
    """The group of the executable running the op."""
    if context.group is None:
        # Reached only by calling an op's implementation outside an executable.
        raise ProgramError("a distributed op ran outside an executable with a process group "
                           "(compile the program with mlxprog.compile)")
    return context.group


def _world_size(context: ExecutionContext) -> int:
    """The declared world size of the program being checked."""
    if context.world_size is None:
        raise ValueError("a distributed op needs the program's process group: declare "
                         "world_size in the program (ProgramBuilder(name, world_size=N))")
    return context.world_size


def _check_declared(avals: list[AVal], attrs: Attrs, context: ExecutionContext) -> None:
    """The program declares its world size."""
    _world_size(context)


def _same(avals: list[AVal], attrs: Attrs, context: ExecutionContext) -> list[AVal]:
    return [avals[0]]


# -- reductions --------------------------------------------------------------

def _reduce(function, operands, attrs, context):
    info = _group(context)
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
    context=True,
)


# -- gather and scatter -------------------------------------------------------

class GatherAttrs(Attrs):
    axis: Axis = 0
    """The axis the ranks' arrays are concatenated along (rank 0's first)."""


def _gather_shape(avals: list[AVal], attrs: GatherAttrs,
                  context: ExecutionContext) -> list[AVal]:
    shape = list(avals[0].shape)
    shape[attrs.axis] *= _world_size(context)
    return [AVal(tuple(shape), avals[0].dtype)]


@register_op("all_gather", attrs=GatherAttrs, check=_check_declared, shape_rule=_gather_shape,
             distributed="collective", context=True)
def all_gather(operands, attrs, context):
    """Every rank's operand concatenated along ``axis`` in rank order: the
    result's ``axis`` is ``world_size`` times longer. Every rank passes the
    same shape; the operand has at least one axis."""
    x, info = operands[0], _group(context)
    if info.size == 1:
        return x
    # MLX gathers along axis 0.
    gathered = mx.distributed.all_gather(mx.moveaxis(x, attrs.axis, 0), group=info.group)
    return mx.moveaxis(gathered, 0, attrs.axis)


class ScatterAttrs(Attrs):
    axis: Axis = 0
    """The axis the sum is split along; its length divides by the world size."""


def _check_scatter(avals: list[AVal], attrs: ScatterAttrs, context: ExecutionContext) -> None:
    """The scattered axis divides by the world size."""
    size, length = _world_size(context), avals[0].shape[attrs.axis]
    if length % size:
        raise CheckError(f"axis {attrs.axis} has length {length}, which does not divide by "
                         f"the world size {size}", attribute="axis")


def _scatter_shape(avals: list[AVal], attrs: ScatterAttrs,
                   context: ExecutionContext) -> list[AVal]:
    shape = list(avals[0].shape)
    shape[attrs.axis] //= _world_size(context)
    return [AVal(tuple(shape), avals[0].dtype)]


@register_op("sum_scatter", attrs=ScatterAttrs, check=_check_scatter,
             shape_rule=_scatter_shape, distributed="collective", context=True)
def sum_scatter(operands, attrs, context):
    """This rank's slice of the elementwise sum over every rank: the sum is
    split along ``axis`` into ``world_size`` equal parts and rank ``r`` gets
    part ``r``. On the CPU (whose ring backend has no ``sum_scatter``) it is
    computed as ``all_sum`` and a slice."""
    x, info = operands[0], _group(context)
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

def _check_peer(rank: int, what: str, context: ExecutionContext) -> None:
    """``rank`` (attribute ``what``) is a rank of a group of at least 2."""
    size = _world_size(context)
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


@register_op("send", attrs=SendAttrs,
             check=lambda avals, attrs, context: _check_peer(attrs.dst, "dst", context),
             shape_rule=_same, distributed="point_to_point", keep=True, context=True,
             group_check=lambda attrs, info: _group_check_peer(attrs.dst, "dst", info))
def send(operands, attrs, context):
    """Send the operand to rank ``dst``, which runs a matching ``recv``; the
    result is the sent array. The send happens even when nothing reads the
    result (the runtime ties it to its block's outputs). On the ring backend
    ``dst`` is a neighbouring rank."""
    info = _group(context)
    return mx.distributed.send(operands[0], attrs.dst, group=info.group)


class RecvAttrs(Attrs):
    shape: list[Size]
    """The shape of the array received."""
    dtype: DType
    """The dtype of the array received."""
    src: int = Field(ge=0)
    """The rank it is received from."""


def _recv_shape(avals: list[AVal], attrs: RecvAttrs, context: ExecutionContext) -> list[AVal]:
    return [AVal(tuple(attrs.shape), to_mlx(attrs.dtype))]


@register_op("recv", attrs=RecvAttrs, operands=0, shape_rule=_recv_shape,
             check=lambda avals, attrs, context: _check_peer(attrs.src, "src", context),
             distributed="point_to_point", context=True,
             group_check=lambda attrs, info: _group_check_peer(attrs.src, "src", info))
def recv(operands, attrs, context):
    """An array of ``shape`` and ``dtype`` received from rank ``src``, which
    runs a matching ``send`` of that shape and dtype. On the ring backend
    ``src`` is a neighbouring rank."""
    info = _group(context)
    return mx.distributed.recv(attrs.shape, to_mlx(attrs.dtype), attrs.src, group=info.group)


# -- the group -------------------------------------------------------------------

def _scalar(avals: list[AVal], attrs: Attrs, context: ExecutionContext) -> list[AVal]:
    return [AVal((), mx.int32)]


@register_op("rank", operands=0, check=_check_declared, shape_rule=_scalar,
             distributed="group", context=True)
def rank(operands, attrs, context):
    """This process's rank in the group (an int32 scalar, 0 to ``world_size - 1``)."""
    return mx.array(_group(context).rank, dtype=mx.int32)


@register_op("world_size", operands=0, check=_check_declared, shape_rule=_scalar,
             distributed="group", context=True)
def world_size(operands, attrs, context):
    """The number of ranks in the group (an int32 scalar)."""
    return mx.array(_group(context).size, dtype=mx.int32)
