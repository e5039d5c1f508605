"""Programs with symbolic dims: static checks, specialisation, output shapes.

A symbolic program is checked at validation by specialising it to a few sample
bindings (every dim at its minimum, then generic odd and even values) and
validating each concrete program: a program that fails for every sample can
never be shape-correct and is rejected with the first error. A program that
fails only for some values (a reshape needing an even length, say) is
accepted; a call with such a value fails with the same clear error when it is
specialised.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Mapping

from . import dims as D
from .dtypes import to_mlx
from .errors import ValidationError
from .program import Instruction, Program, SubProgram
from .registry import AVal, lookup
from .validate import ValidatedProgram, validate_static


@dataclass(frozen=True, eq=False)
class SymbolicProgram:
    """A validated program with symbolic dims; :meth:`specialize` makes a
    concrete :class:`ValidatedProgram` for one binding."""

    program: Program
    dims: Mapping[str, D.DimSpec]
    input_shapes: tuple[tuple[D.Expr, ...], ...]
    capture_avals: tuple[AVal, ...]
    symbolic_locations: frozenset[str]
    out_shapes: tuple[tuple[D.Expr | None, ...], ...]
    out_dtypes: tuple[Any, ...]
    sample: ValidatedProgram
    """The program specialised to the first sample binding that validated."""

    def specialize(self, bindings: Mapping[str, int]) -> ValidatedProgram:
        """The program with every dim replaced by its value, validated."""
        try:
            return validate_static(specialize(self.program, bindings))
        except ValidationError as exc:
            shown = ", ".join(f"{k}={v}" for k, v in sorted(bindings.items()))
            raise ValidationError(f"{exc.detail} (with dims {shown})", exc.location,
                                  exc.op) from None

    def describe_outputs(self) -> list[str]:
        """Output shapes as text; ``?`` marks an axis whose size could not be
        expressed in the program's dims."""
        from .dtypes import name_of

        return [
            name_of(dtype) + "[" + ", ".join("?" if e is None else D.fmt(e) for e in shape) + "]"
            for shape, dtype in zip(self.out_shapes, self.out_dtypes)
        ]


def is_symbolic(program: Program) -> bool:
    """True when the program declares dims or uses a symbolic input shape."""
    return bool(program.dims) or any(
        isinstance(d, str) for spec in program.inputs for d in spec.shape
    ) or any(spec.value_of is not None for spec in program.inputs)


def validate_symbolic(program: Program) -> SymbolicProgram:
    """Check a symbolic program (see the module docstring) and describe it."""
    for name in program.dims:
        if not D.is_dim_name(name):
            raise ValidationError(f"dim name {name!r} is not an identifier", "dims")
    input_shapes = []
    for spec in program.inputs:
        shape = []
        for axis, entry in enumerate(spec.shape):
            try:
                shape.append(D.parse_dim(entry, program.dims))
            except ValueError as exc:
                raise ValidationError(str(exc), f"input {spec.name!r} axis {axis}") from None
        if spec.value_of is not None:
            if spec.value_of not in program.dims:
                raise ValidationError(f"value_of names unknown dim {spec.value_of!r}",
                                      f"input {spec.name!r}")
            if shape or spec.dtype not in ("int32", "int64", "uint32", "uint64"):
                raise ValidationError("a value_of input is an integer scalar (shape [], "
                                      f"dtype int32 or int64), found {spec.dtype}{spec.shape}",
                                      f"input {spec.name!r}")
        input_shapes.append(tuple(shape))
    for spec in program.captures:
        if any(isinstance(d, str) for d in spec.shape):
            raise ValidationError("captures have static shapes (bind weights by exact shape)",
                                  f"capture {spec.name!r}")
    locations = _symbolic_locations(program.instructions, program.dims, "")
    bound = set().union(*(D.names(e) for shape in input_shapes for e in shape))
    unbound = sorted(set(program.dims) - bound)
    if unbound:
        raise ValidationError(f"dims {unbound} are declared but no input shape uses them, "
                              "so they could never be bound", "dims")

    samples, first_error = [], None
    for bindings in D.sample_bindings(program.dims):
        try:
            samples.append((bindings, validate_static(specialize(program, bindings))))
        except ValidationError as exc:
            first_error = first_error or (exc, bindings)
    if not samples:
        exc, bindings = first_error
        shown = ", ".join(f"{k}={v}" for k, v in sorted(bindings.items()))
        raise ValidationError(f"{exc.detail} (with dims {shown}; the program fails for "
                              "every dim value tried)", exc.location, exc.op) from None

    out_shapes, out_dtypes = _lift_outputs(program, input_shapes, samples)
    return SymbolicProgram(
        program=program,
        dims=dict(program.dims),
        input_shapes=tuple(input_shapes),
        capture_avals=tuple(AVal(tuple(s.shape), to_mlx(s.dtype)) for s in program.captures),
        symbolic_locations=frozenset(locations),
        out_shapes=out_shapes,
        out_dtypes=out_dtypes,
        sample=samples[0][1],
    )


def specialize(program: Program, bindings: Mapping[str, int]) -> Program:
    """The concrete program for one binding: dims replaced in input shapes and
    in int-valued attributes; ``value_of`` inputs stay (as int scalars)."""
    inputs = [
        spec.model_copy(update={"shape": [
            e if isinstance(e, int) else D.evaluate(D.parse(e), bindings) for e in spec.shape
        ]}) if any(isinstance(e, str) for e in spec.shape) else spec
        for spec in program.inputs
    ]
    return program.model_copy(update={
        "dims": {},
        "inputs": inputs,
        "instructions": _specialize_instructions(program.instructions, program.dims, bindings),
    })


def _specialize_instructions(instructions: list[Instruction], dims, bindings) -> list[Instruction]:
    return [specialize_instruction(inst, dims, bindings) for inst in instructions]


def specialize_instruction(inst: Instruction, dims, bindings) -> Instruction:
    """One instruction (and its subprograms) with dims in integer-valued
    attributes replaced by their values under ``bindings``."""
    attrs, used = substitute_attrs(inst, dims, bindings, "")
    subs = {name: SubProgram(instructions=_specialize_instructions(sub.instructions, dims,
                                                                   bindings),
                             outputs=sub.outputs)
            for name, sub in inst.subprograms.items()}
    if used or subs:
        inst = inst.model_copy(update={"attrs": attrs, "subprograms": subs})
    return inst


def _symbolic_locations(instructions: list[Instruction], dims, prefix: str) -> set[str]:
    found = set()
    for index, inst in enumerate(instructions):
        where = f"{prefix}instruction {index}"
        try:
            _, used = substitute_attrs(inst, dims, None, where)
        except ValueError as exc:
            raise ValidationError(str(exc).split(": ", 1)[-1], where, inst.op) from None
        if used:
            found.add(where)
        for name, sub in inst.subprograms.items():
            found |= _symbolic_locations(sub.instructions, dims, f"{where} > {name} > ")
    return found


def substitute_attrs(inst: Instruction, dims, bindings, where: str) -> tuple[dict, bool]:
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
            value, flag = D.substitute(value, dims, bindings, f"attribute {key!r}")
            used |= flag
        attrs[key] = value
    return attrs, used


def _admits_str(annotation: Any) -> bool:
    """Whether a field annotation accepts strings (then its strings are not dims)."""
    if annotation is str:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return any(isinstance(a, str) for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _admits_str(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_admits_str(a) for a in typing.get_args(annotation))
    return False


def _lift_outputs(program: Program, input_shapes, samples):
    """Express each output axis in the program's dims by matching its size
    across the sample bindings against candidate expressions."""
    candidates: list[D.Expr] = sorted(program.dims)
    for shape in input_shapes:
        candidates.extend(e for e in shape if not isinstance(e, int))
    candidates.extend(_attr_expressions(program.instructions, program.dims))
    names = sorted(program.dims)
    candidates.extend(D.BinOp("*", a, b) for i, a in enumerate(names) for b in names[i:])
    first = samples[0][1]
    out_shapes = []
    for k, aval in enumerate(first.out_avals):
        shape = []
        for axis in range(len(aval.shape)):
            sizes = [vp.out_avals[k].shape[axis] for _, vp in samples]
            shape.append(_match(sizes, [b for b, _ in samples], candidates))
        out_shapes.append(tuple(shape))
    return tuple(out_shapes), tuple(a.dtype for a in first.out_avals)


def _attr_expressions(instructions: list[Instruction], dims) -> list[D.Expr]:
    found = []
    for inst in instructions:
        spec = lookup(inst.op)
        for key, value in inst.attrs.items():
            field = spec.attrs.model_fields.get(key) if spec else None
            if field is not None and not _admits_str(field.annotation):
                found.extend(D.parse(v) for v in _strings(value))
        for sub in inst.subprograms.values():
            found.extend(_attr_expressions(sub.instructions, dims))
    return found


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def _match(sizes: list[int], bindings: list[dict], candidates: list[D.Expr]) -> D.Expr | None:
    if len(set(sizes)) == 1:
        return sizes[0]
    for candidate in candidates:
        if all(D.evaluate(candidate, b) == s for b, s in zip(bindings, sizes)):
            return candidate
    return None
