"""Validating programs with symbolic dims.

A symbolic program is checked by specialising it to a few sample bindings
(every dim at its minimum, then generic odd and even values; see
:func:`mlxprog.symbolic.specialize.sample_bindings`) and validating each
concrete program: a program that fails for every sample can never be
shape-correct and is rejected with the first error. A program that fails only
for some values (a reshape needing an even length, say) is accepted; a call
with such a value fails with the same clear error when it is specialised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..arrays import AVal, name_of, to_mlx
from ..errors import ValidationError
from ..format.paths import StepPath, render
from ..format.program import DimSpec, Program
from ..limits import Limits
from ..symbolic.expr import BinOp, Expr, evaluate, fmt, is_dim_name, names, parse_dim
from ..symbolic.specialize import (
    DimExpressionError,
    attr_expressions,
    dim_dependent_paths,
    sample_bindings,
    specialize,
)
from .program import validate_static
from .steps import ValidatedProgram


@dataclass(frozen=True, eq=False)
class SymbolicProgram:
    """A validated program with symbolic dims; :meth:`specialize` makes a
    concrete :class:`ValidatedProgram` for one binding.

    ``dim_dependent`` holds the paths of the instructions whose attributes use
    dims: their segments need a trace per binding.
    """

    program: Program
    dims: Mapping[str, DimSpec]
    input_shapes: tuple[tuple[Expr, ...], ...]
    capture_avals: tuple[AVal, ...]
    dim_dependent: frozenset[StepPath]
    out_shapes: tuple[tuple[Expr | None, ...], ...]
    out_dtypes: tuple[Any, ...]
    sample: ValidatedProgram
    """The program specialised to a sample binding that validated: a generic
    one (no dim of size 1) where one did, as a plan for most bindings looks."""
    limits: Limits | None = None
    """The limits each specialisation is validated under (None: the defaults)."""

    def specialize(self, bindings: Mapping[str, int]) -> ValidatedProgram:
        """The program with every dim replaced by its value, validated (under
        :attr:`limits`: a binding that makes a result too large fails here,
        before anything runs)."""
        try:
            return validate_static(specialize(self.program, bindings), self.limits)
        except ValidationError as exc:
            raise ValidationError(f"{exc.detail} (with dims {_shown(bindings)})", exc.location,
                                  exc.op) from None

    def describe_outputs(self) -> list[str]:
        """Output shapes as text; ``?`` marks an axis whose size could not be
        expressed in the program's dims."""
        return [
            name_of(dtype) + "[" + ", ".join("?" if e is None else fmt(e) for e in shape) + "]"
            for shape, dtype in zip(self.out_shapes, self.out_dtypes)
        ]


def is_symbolic(program: Program) -> bool:
    """True when the program declares dims or uses a symbolic input shape."""
    return bool(program.dims) or any(
        isinstance(d, str) for spec in program.inputs for d in spec.shape
    ) or any(spec.value_of is not None for spec in program.inputs)


def validate_symbolic(program: Program, limits: Limits | None = None) -> SymbolicProgram:
    """Check a symbolic program (see the module docstring) under ``limits``
    and describe it."""
    for name in program.dims:
        if not is_dim_name(name):
            raise ValidationError(f"dim name {name!r} is not an identifier", "dims")
    input_shapes = [_input_shape(spec, program.dims) for spec in program.inputs]
    try:
        dependent = dim_dependent_paths(program.instructions, program.dims)
    except DimExpressionError as exc:
        raise ValidationError(str(exc), render(exc.path), exc.op) from None
    bound = set().union(*(names(e) for shape in input_shapes for e in shape))
    unbound = sorted(set(program.dims) - bound)
    if unbound:
        raise ValidationError(f"dims {unbound} are declared but no input shape uses them, "
                              "so they could never be bound", "dims")

    first = sample_bindings(program.dims)
    samples, first_error = _validate_at(program, first, limits)
    if len(samples) < len(first):
        # Dims often bound one another without saying so (T <= S); when a
        # sample fails, values growing against the declaration order are
        # tried as well, so a program valid only for some orderings still
        # has generic samples to describe its outputs by. A program valid at
        # every first sample is validated no more often.
        again = [b for b in sample_bindings(program.dims, reverse=True) if b not in first]
        samples += _validate_at(program, again, limits)[0]
    if not samples:
        exc, bindings = first_error
        raise ValidationError(f"{exc.detail} (with dims {_shown(bindings)}; the program fails "
                              "for every dim value tried)", exc.location, exc.op) from None

    out_shapes, out_dtypes = _lift_outputs(program, input_shapes, samples)
    return SymbolicProgram(
        program=program,
        dims=dict(program.dims),
        input_shapes=tuple(input_shapes),
        capture_avals=tuple(AVal(tuple(s.shape), to_mlx(s.dtype)) for s in program.captures),
        dim_dependent=frozenset(dependent),
        out_shapes=out_shapes,
        out_dtypes=out_dtypes,
        sample=next((v for b, v in samples if 1 not in b.values()), samples[0][1]),
        limits=limits,
    )


def _validate_at(program: Program, bindings: list[dict[str, int]], limits: Limits | None):
    """The ``(binding, validated program)`` pairs of the bindings the program
    is valid at, and the first error with its binding (None when none failed)."""
    valid, first_error = [], None
    for binding in bindings:
        try:
            valid.append((binding, validate_static(specialize(program, binding), limits)))
        except ValidationError as exc:
            first_error = first_error or (exc, binding)
    return valid, first_error


def _input_shape(spec, dims: Mapping[str, DimSpec]) -> tuple[Expr, ...]:
    shape = []
    for axis, entry in enumerate(spec.shape):
        try:
            shape.append(parse_dim(entry, dims))
        except ValueError as exc:
            raise ValidationError(str(exc), f"input {spec.name!r} axis {axis}") from None
    if spec.value_of is not None:
        if spec.value_of not in dims:
            raise ValidationError(f"value_of names unknown dim {spec.value_of!r}",
                                  f"input {spec.name!r}")
        if shape or spec.dtype not in ("int32", "int64", "uint32", "uint64"):
            raise ValidationError("a value_of input is an integer scalar (shape [], "
                                  f"dtype int32 or int64), found {spec.dtype}{spec.shape}",
                                  f"input {spec.name!r}")
    return tuple(shape)


def _shown(bindings: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(bindings.items()))


def _lift_outputs(program: Program, input_shapes, samples):
    """Express each output axis in the program's dims by matching its size
    across the sample bindings against candidate expressions."""
    candidates: list[Expr] = sorted(program.dims)
    for shape in input_shapes:
        candidates.extend(e for e in shape if not isinstance(e, int))
    candidates.extend(attr_expressions(program.instructions))
    dims = sorted(program.dims)
    candidates.extend(BinOp("*", a, b) for i, a in enumerate(dims) for b in dims[i:])
    # Once each, first place kept: the first match is the same, and a model's
    # layers repeat the same expressions in their attributes.
    candidates = list(dict.fromkeys(candidates))
    bindings = [b for b, _ in samples]
    # A dim that can vary but has one value at every sample that validated
    # (only the all-minimum binding did, say) cannot be told from a constant.
    stuck = {d for d, spec in program.dims.items()
             if spec.min != spec.max and len({b[d] for b in bindings}) == 1}
    first = samples[0][1]
    out_shapes = []
    for k, aval in enumerate(first.out_avals):
        shape = []
        for axis in range(len(aval.shape)):
            sizes = [vp.out_avals[k].shape[axis] for _, vp in samples]
            shape.append(_match(sizes, bindings, candidates, stuck))
        out_shapes.append(tuple(shape))
    return tuple(out_shapes), tuple(a.dtype for a in first.out_avals)


def _match(sizes: list[int], bindings: list[dict], candidates: list[Expr],
           stuck: set[str]) -> Expr | None:
    """The size of an output axis at every sample as a constant or the first
    candidate expression matching it; None (shown ``?``) when nothing
    matches, or when an expression over a ``stuck`` dim matches too, as the
    samples cannot say which it is."""
    def fits(c: Expr) -> bool:
        return all(_value(c, b) == s for b, s in zip(bindings, sizes))

    if stuck and any(names(c) & stuck and fits(c) for c in candidates):
        return None
    if len(set(sizes)) == 1:
        return sizes[0]
    return next((c for c in candidates if fits(c)), None)


def _value(expr: Expr, bindings: Mapping[str, int]) -> int | None:
    # A candidate that divides by zero at a sample describes no output there.
    try:
        return evaluate(expr, bindings)
    except ValueError:
        return None
