"""Specialisation: a symbolic program made concrete for one binding of its dims.

Dims appear in input shapes and in integer-valued attributes (``"shape":
["B*T", 576]``); :func:`specialize` replaces them by their values. The sample
bindings that validation checks a symbolic program at, and the sizes the
builder infers shapes at, come from the one list of sample sizes here.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Mapping

from ..errors import ValidationError
from ..format.paths import StepPath, render
from ..format.program import DimSpec, Instruction, Program, SubProgram, TensorSpec
from ..limits import MAX_DIM
from ..ops.registry import lookup
from .expr import Expr, evaluate, fmt, parse, parse_dim

ODD_SAMPLE_SIZES = (7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47)
"""Generic dim sizes (distinct, odd, unusual): a size that happens to equal
another dim or a constant would hide shape mistakes."""

EVEN_SAMPLE_SIZES = (6, 10, 14, 22, 26, 34, 38, 46, 58, 62, 74, 82)
"""Generic even sizes, for a second sample binding (catches odd-only programs)."""


def sample_bindings(dims: Mapping[str, DimSpec], reverse: bool = False) -> list[dict[str, int]]:
    """Bindings used to check a symbolic program statically: every dim at its
    minimum, then two assignments of distinct, generic values (odd and even)
    within the bounds, growing in declaration order (``reverse``: in the
    reverse order). Dims often bound one another without saying so (a
    prompt length ``T`` declared before the cache length ``S`` it must fit
    in): growing in declaration order keeps such a program valid at the
    samples, as the builder's sample sizes do (:func:`builder_sample`)."""
    samples = [{d: spec.min for d, spec in dims.items()}]
    ordered = list(dims.items())[::-1] if reverse else list(dims.items())
    for pool in (ODD_SAMPLE_SIZES, EVEN_SAMPLE_SIZES):
        sample = {}
        for i, (d, spec) in enumerate(ordered):
            value = pool[i % len(pool)] * (1 + i // len(pool))
            if not spec.contains(value):
                value = spec.max if spec.max is not None and value > spec.max else spec.min
            sample[d] = value
        samples.append(sample)
    unique = []
    for s in samples:
        if s not in unique:
            unique.append(s)
    return unique


def builder_sample(spec: DimSpec, taken: set[int]) -> int:
    """The size a builder infers shapes at for a new dim: the first generic
    size within its bounds that no other dim has (else its minimum)."""
    return next((v for v in ODD_SAMPLE_SIZES if v not in taken and spec.contains(v)), spec.min)


def specialize(program: Program, bindings: Mapping[str, int]) -> Program:
    """The concrete program for one binding: dims replaced in input shapes and
    in int-valued attributes; ``value_of`` inputs stay (as int scalars).
    :class:`ValidationError` names an input whose size is not one under
    ``bindings`` (negative, beyond MLX's ``2**31 - 1``, a division by zero)
    or an instruction whose attribute cannot be evaluated."""
    inputs = [_specialize_input(spec, bindings) for spec in program.inputs]
    try:
        instructions = [specialize_instruction(inst, program.dims, bindings, (index,))
                        for index, inst in enumerate(program.instructions)]
    except DimExpressionError as exc:
        raise ValidationError(str(exc), render(exc.path), exc.op) from None
    return program.model_copy(update={"dims": {}, "inputs": inputs,
                                      "instructions": instructions})


def _specialize_input(spec: TensorSpec, bindings: Mapping[str, int]) -> TensorSpec:
    if not any(isinstance(e, str) for e in spec.shape):
        return spec
    shape = []
    for axis, entry in enumerate(spec.shape):
        where = f"input {spec.name!r} axis {axis}"
        expr = entry if isinstance(entry, int) else parse(entry)
        try:
            size = evaluate(expr, bindings)
        except ValueError as exc:
            raise ValidationError(str(exc), where) from None
        if not 0 <= size <= MAX_DIM:
            # The callers add the bindings to the message.
            raise ValidationError(f"size {fmt(expr)} is {size}; an axis has 0 to {MAX_DIM} "
                                  "elements", where)
        shape.append(size)
    # model_copy does not validate: the sizes were just checked.
    return spec.model_copy(update={"shape": shape})


def specialize_instruction(inst: Instruction, dims: Mapping[str, DimSpec],
                           bindings: Mapping[str, int], path: StepPath = ()) -> Instruction:
    """One instruction (and its subprograms) with dims in integer-valued
    attributes replaced by their values under ``bindings``;
    :class:`DimExpressionError` (a ValueError) at ``path`` when an
    expression cannot be evaluated there (a division by zero)."""
    try:
        attrs, used = substitute_attrs(inst, dims, bindings)
    except ValueError as exc:
        raise DimExpressionError(str(exc), path, inst.op) from None
    subs = {name: SubProgram(
                instructions=[specialize_instruction(i, dims, bindings, (*path, name, k))
                              for k, i in enumerate(sub.instructions)],
                outputs=sub.outputs)
            for name, sub in inst.subprograms.items()}
    if used or subs:
        inst = inst.model_copy(update={"attrs": attrs, "subprograms": subs})
    return inst


def dim_dependent_paths(instructions: list[Instruction], dims: Mapping[str, DimSpec],
                        prefix: StepPath = ()) -> set[StepPath]:
    """The paths of the instructions whose attributes use dims (their
    segments need a trace per binding). ValueError names a bad expression;
    :class:`DimExpressionError` says where it is."""
    found = set()
    for index, inst in enumerate(instructions):
        path = (*prefix, index)
        try:
            _, used = substitute_attrs(inst, dims, None)
        except ValueError as exc:
            raise DimExpressionError(str(exc), path, inst.op) from None
        if used:
            found.add(path)
        for name, sub in inst.subprograms.items():
            found |= dim_dependent_paths(sub.instructions, dims, (*path, name))
    return found


class DimExpressionError(ValueError):
    """An attribute holds a string that is not an expression over the dims;
    ``path`` and ``op`` say which instruction."""

    def __init__(self, message: str, path: StepPath, op: str):
        super().__init__(message)
        self.path = path
        self.op = op


def substitute_attrs(inst: Instruction, dims: Mapping[str, DimSpec],
                     bindings: Mapping[str, int] | None) -> tuple[dict, bool]:
    """An instruction's attrs with dim expressions in integer-valued fields
    replaced by their values under ``bindings`` (None: only check them), and
    whether any were found."""
    spec = lookup(inst.op)
    if spec is None or not dims:
        return inst.attrs, False
    fields = spec.attrs.model_fields
    attrs, used = {}, False
    for key, value in inst.attrs.items():
        field = fields.get(key)
        if field is not None and not _admits_str(field.annotation):
            value, flag = _substitute(value, dims, bindings, f"attribute {key!r}")
            used |= flag
        attrs[key] = value
    return attrs, used


def _substitute(value: Any, dims: Mapping[str, DimSpec], bindings: Mapping[str, int] | None,
                where: str) -> tuple[Any, bool]:
    """Replace dim-expression strings inside an int-valued attribute (nested
    lists allowed) by their values. Returns ``(value, used_dims)``; with
    ``bindings`` None only checks the expressions."""
    if isinstance(value, str):
        try:
            expr = parse_dim(value, dims)
            return (value if bindings is None else evaluate(expr, bindings)), True
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    if isinstance(value, list):
        used = False
        out = []
        for item in value:
            new, flag = _substitute(item, dims, bindings, where)
            out.append(new)
            used |= flag
        return out, used
    return value, False


def attr_expressions(instructions: list[Instruction]) -> list[Expr]:
    """Every dim expression written in an integer-valued attribute (candidates
    for expressing output sizes in the dims)."""
    found = []
    for inst in instructions:
        spec = lookup(inst.op)
        for key, value in inst.attrs.items():
            field = spec.attrs.model_fields.get(key) if spec else None
            if field is not None and not _admits_str(field.annotation):
                found.extend(parse(v) for v in _strings(value))
        for sub in inst.subprograms.values():
            found.extend(attr_expressions(sub.instructions))
    return found


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def _admits_str(annotation: Any) -> bool:
    """Whether a field annotation accepts strings (then its strings are not dims)."""
    if annotation is str:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return any(isinstance(a, str) for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _admits_str(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, tuple, list):
        # A sequence of strings holds names, not dims.
        return any(_admits_str(a) for a in typing.get_args(annotation) if a is not Ellipsis)
    return False
