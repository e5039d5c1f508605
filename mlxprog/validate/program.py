"""Validating a program whose shapes are all concrete."""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from ..arrays import AVal, exact_array, to_mlx
from ..errors import ValidationError
from ..format.program import NONFINITE, Constant, Program
from ..limits import Limits
from ..ops.context import ExecutionContext
from .block import Base, validate_block
from .steps import ValidatedProgram


def validate_static(program: Program, limits: Limits | None = None) -> ValidatedProgram:
    """Validate a program without symbolic dims: declarations, constants, then
    the body (see :func:`~mlxprog.validate.block.validate_block`), held to
    ``limits`` (default: :class:`~mlxprog.limits.Limits`)."""
    _check_unique(program.inputs, "input")
    _check_unique(program.captures, "capture")
    inputs = tuple(AVal(tuple(s.shape), to_mlx(s.dtype)) for s in program.inputs)
    captures = tuple(AVal(tuple(s.shape), to_mlx(s.dtype)) for s in program.captures)
    constants = tuple(_make_constant(i, c) for i, c in enumerate(program.constants))
    context = ExecutionContext(world_size=program.world_size)
    base = Base(inputs, captures, constants, limits, context)
    block = validate_block(base, program.instructions, program.outputs, [], path=())
    return ValidatedProgram(program, inputs, captures, constants, block, limits)


def _check_unique(specs, kind: str) -> None:
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise ValidationError(f"duplicate {kind} name {spec.name!r}", f"{kind} {i}")
        seen.add(spec.name)


def _decode(value: Any) -> Any:
    if isinstance(value, str):
        return NONFINITE[value]
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _make_constant(index: int, const: Constant) -> mx.array:
    try:
        return exact_array(_decode(const.value), to_mlx(const.dtype))
    except ValueError as exc:
        raise ValidationError(str(exc), f"constant {index}") from None
