"""The process group of an executable: chosen and checked at compile.

:func:`setup` resolves the group of a program that declares ``world_size``,
checks its size and each distributed step against this rank, then has the
ranks compare digests of their collectives, so ranks that would run
different collectives fail at compile instead of exchanging wrong data or
waiting forever.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import mlx.core as mx
import numpy as np

from ..arrays import name_of
from ..errors import ProgramError
from ..format.program import Program
from ..ops.context import GroupInfo
from ..validate.steps import Block

_DIGEST_WORDS = 8  # a sha256 digest as uint32 words


def setup(program: Program, block: Block, group: Any) -> GroupInfo | None:
    """The group the program runs on (None for a program that declares no
    ``world_size``): ``group`` or ``mx.distributed.init()``, checked against
    the declared size and against every distributed step, and agreed on by
    every rank (see :func:`agree`)."""
    declared = program.world_size
    if declared is None:
        if group is not None:
            raise ProgramError("group= was given for a program that declares no world_size "
                               "(it uses no distributed op)")
        return None
    if group is None:
        group = mx.distributed.init()
    elif not isinstance(group, mx.distributed.Group):
        raise ProgramError(f"group must be an mx.distributed.Group, got {type(group).__name__}")
    info = GroupInfo.of(group)
    if info.size != declared:
        raise ProgramError(
            f"the program was built for world size {declared}; the group has {info.size} "
            f"rank(s) (launch it with `mlx.launch -n {declared} ...`, or pass a group of "
            f"that size as compile(group=...))")
    for step in block.walk():
        if step.spec.group_check is not None:
            try:
                step.spec.group_check(step.attrs, info)
            except ValueError as exc:
                raise ProgramError(f"{step.location} ({step.spec.name}): {exc} "
                                   f"(on rank {info.rank} of {info.size})") from None
    agree(info, collectives_digest(block))
    return info


def collectives_digest(block: Block) -> bytes:
    """The sha256 of the block's collective steps in program order: op,
    attributes and operand shapes and dtypes — what must be the same on every
    rank. Point-to-point steps are left out (a ``send`` pairs with another
    rank's ``recv``), and so is everything else, which may differ per rank
    (the shapes of a tensor-parallel shard, say)."""
    entries = [
        [step.spec.name, step.attrs.model_dump(mode="json"),
         [[list(holder.avals[a].shape), name_of(holder.avals[a].dtype)] for a in step.args]]
        for holder, step in _steps(block) if step.spec.distributed == "collective"
    ]
    text = json.dumps(entries, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).digest()


def _steps(block: Block):
    """Every step of the block and its subprograms in program order, each
    with the block that holds it (whose avals its operand slots index)."""
    for step in block.steps:
        yield block, step
        for sub in step.blocks.values():
            yield from _steps(sub)


def agree(info: GroupInfo, digest: bytes) -> None:
    """Gather every rank's digest and raise :class:`ProgramError` on every
    rank when any differs from rank 0's."""
    if info.size == 1:
        return
    mine = mx.array(np.frombuffer(digest, dtype=np.uint32).reshape(1, _DIGEST_WORDS))
    try:
        gathered = mx.distributed.all_gather(mine, group=info.group)
        mx.eval(gathered)
    except (RuntimeError, ValueError) as exc:
        raise ProgramError(f"rank {info.rank}: comparing the compiled programs with the other "
                           f"ranks failed: {exc}") from None
    rows = np.array(gathered).tobytes()
    digests = [rows[i * 32:(i + 1) * 32] for i in range(info.size)]
    differ = [r for r in range(1, info.size) if digests[r] != digests[0]]
    if differ:
        ranks = ", ".join(str(r) for r in differ)
        raise ProgramError(
            f"rank(s) {ranks} compiled a program whose collectives differ from rank 0's "
            f"(digest {digests[differ[0]].hex()[:12]} vs {digests[0].hex()[:12]}); every rank "
            f"must run the same collectives (op, attributes, operand shapes and dtypes) in "
            f"the same order (this is rank {info.rank})")
