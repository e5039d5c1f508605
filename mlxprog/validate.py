"""Validation: structure, refs, ops, attributes, and static shape/dtype inference.

``validate(program)`` turns a :class:`~mlxprog.program.Program` into a
:class:`ValidatedProgram`: every instruction resolved to a :class:`Step` that
names its op spec, validated attrs and environment slots. Nothing is traced or
evaluated; result shapes come from each op's shape rule or from running the op
on unevaluated MLX placeholders (MLX builds graphs lazily, so this allocates
nothing). Any problem raises :class:`~mlxprog.errors.ValidationError` naming the
instruction, its subprogram path and the op.

Environment layout (one flat list per block):
``[inputs | captures | constants | carry | results]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import mlx.core as mx
import numpy as np
import pydantic

from .attrs import Attrs
from .dtypes import is_floating, is_integer, name_of, to_mlx
from .errors import ValidationError
from .program import NONFINITE, Constant, Instruction, Program, Ref, ResultRef, gc_paused
from .registry import AVal, OpSpec, lookup, suggest


@dataclass(frozen=True, eq=False)
class Step:
    """One validated instruction: op spec, attrs, operand slots, result slots."""

    index: int
    location: str
    spec: OpSpec
    attrs: Attrs
    args: tuple[int, ...]
    out: int
    n_out: int
    blocks: dict[str, Block] = field(default_factory=dict)

    @property
    def unpack(self) -> bool:
        """True when the implementation returns a sequence of results."""
        return self.spec.outputs != 1

    @property
    def results(self) -> range:
        """The environment slots this step writes."""
        return range(self.out, self.out + self.n_out)


def _step(index, location, spec, attrs, args, out, n_out, blocks) -> Step:
    """``Step(...)`` for the validator's loop. The frozen dataclass's ``__init__``
    sets each of the eight fields with its own ``object.__setattr__`` call
    (about a third of the time a simple instruction takes to validate); this
    sets the instance dict to the same contents at once."""
    step = object.__new__(Step)
    object.__setattr__(step, "__dict__", {
        "index": index, "location": location, "spec": spec, "attrs": attrs,
        "args": args, "out": out, "n_out": n_out, "blocks": blocks,
    })
    return step


@dataclass(frozen=True, eq=False)
class Block:
    """A validated instruction list (the program body or a subprogram)."""

    location: str
    steps: tuple[Step, ...]
    n_prefix: int
    n_carry: int
    outputs: tuple[int, ...]
    avals: tuple[AVal, ...]

    @property
    def n_slots(self) -> int:
        """Size of the environment this block runs in."""
        return len(self.avals)

    @property
    def carry_avals(self) -> list[AVal]:
        """Shapes and dtypes of the carry values."""
        return list(self.avals[self.n_prefix : self.n_prefix + self.n_carry])

    @property
    def out_avals(self) -> list[AVal]:
        """Shapes and dtypes of the block's outputs."""
        return [self.avals[s] for s in self.outputs]


@dataclass(frozen=True, eq=False)
class ValidatedProgram:
    """A program that passed validation, with its resolved top-level block."""

    program: Program
    input_avals: tuple[AVal, ...]
    capture_avals: tuple[AVal, ...]
    constants: tuple[mx.array, ...]
    block: Block

    @property
    def out_avals(self) -> list[AVal]:
        """Shapes and dtypes of the program's outputs."""
        return self.block.out_avals


def validate(program: Program):
    """Check a program completely and resolve it for execution.

    Returns a :class:`ValidatedProgram`, or for a program with symbolic dims a
    :class:`~mlxprog.symbolic.SymbolicProgram`. Raises :class:`ValidationError`
    on the first problem, naming where it is.
    """
    from .symbolic import is_symbolic, validate_symbolic

    with gc_paused():
        if is_symbolic(program):
            return validate_symbolic(program)
        return validate_static(program)


def validate_static(program: Program) -> ValidatedProgram:
    """Validate a program whose shapes are all concrete."""
    _check_unique(program.inputs, "input")
    _check_unique(program.captures, "capture")
    inputs = tuple(AVal(tuple(s.shape), to_mlx(s.dtype)) for s in program.inputs)
    captures = tuple(AVal(tuple(s.shape), to_mlx(s.dtype)) for s in program.captures)
    constants = tuple(_make_constant(i, c) for i, c in enumerate(program.constants))
    base = Base(inputs, captures, constants)
    block = validate_block(base, program.instructions, program.outputs, [], location="")
    return ValidatedProgram(program, inputs, captures, constants, block)


class Base:
    """The values every block of a program sees: inputs, captures, constants."""

    def __init__(self, inputs, captures, constants):
        self.n_inputs = len(inputs)
        self.n_captures = len(captures)
        self.n_constants = len(constants)
        self.avals = [*inputs, *captures, *(AVal.of(c) for c in constants)]
        self.placeholders = [
            *(_placeholder(a) for a in inputs),
            *(_placeholder(a) for a in captures),
            *constants,
        ]


def _placeholder(aval: AVal) -> mx.array:
    # Never evaluated: MLX records the node without allocating its data.
    return mx.zeros(aval.shape, aval.dtype)


def validate_block(
    base: Base,
    instructions: Sequence[Instruction],
    outputs: Sequence[Ref],
    carry: Sequence[AVal],
    location: str,
) -> Block:
    """Validate one instruction list whose carry values have the given avals.

    Structured ops (``while``, ``cond``) call this for their subprograms, with
    ``location`` naming the path to them.
    """
    scope = _Scope(base, carry, location)
    steps = [scope.add(index, inst) for index, inst in enumerate(instructions)]
    out_slots = tuple(
        scope.resolve(ref, f"{_join(location, 'outputs')}", f"output {i}")
        for i, ref in enumerate(outputs)
    )
    return Block(
        location=location,
        steps=tuple(steps),
        n_prefix=len(base.avals),
        n_carry=len(carry),
        outputs=out_slots,
        avals=tuple(scope.avals),
    )


def _join(location: str, part: str) -> str:
    return f"{location} > {part}" if location else part


class _Scope:
    def __init__(self, base: Base, carry: Sequence[AVal], location: str):
        self.base = base
        self.location = location
        self.n_carry = len(carry)
        self.avals: list[AVal] = [*base.avals, *carry]
        self.placeholders: list[mx.array] = [*base.placeholders, *(_placeholder(a) for a in carry)]
        self.n_results = 0
        self.first_result = len(self.avals)  # the slot of result 0
        self.prefix = f"{location} > " if location else ""
        # op name -> (spec, min operands, max operands), looked up once per scope
        self.ops: dict[str, tuple[OpSpec, int, int | None]] = {}
        # Instructions without attrs or subprograms whose op and operand avals
        # match infer alike: (op, *avals) -> infer's result, computed once.
        self.inferred: dict[tuple, tuple] = {}

    def resolve(self, ref: Ref, where: str, what: str, op: str | None = None) -> int:
        """The environment slot of a ref, or a ValidationError saying why it is bad
        (naming ``op``, the instruction's op, when the ref is an operand)."""
        b = self.base
        kind = ref.kind
        idx = getattr(ref, kind)  # ref.index would find the kind again
        if kind == "input":
            limit, offset = b.n_inputs, 0
        elif kind == "capture":
            limit, offset = b.n_captures, b.n_inputs
        elif kind == "const":
            limit, offset = b.n_constants, b.n_inputs + b.n_captures
        elif kind == "carry":
            if not self.location:
                raise ValidationError(
                    f"{what} is a carry ref, but carry refs exist only inside subprograms",
                    where,
                    op,
                )
            limit, offset = self.n_carry, len(b.avals)
        else:
            if idx >= self.n_results:
                raise ValidationError(
                    f"{what} refers to result {idx}, but only {self.n_results} result(s) "
                    "exist at this point (a ref may only point to a result already produced)",
                    where,
                    op,
                )
            return self.first_result + idx
        if idx >= limit:
            raise ValidationError(
                f"{what} refers to {kind} {idx}, but there are only {limit} {kind}(s)",
                where,
                op,
            )
        return offset + idx

    def add(self, index: int, inst: Instruction) -> Step:
        # This runs once per instruction (100,000 times for a large program), so
        # the common case is kept cheap: the op's spec and operand range come
        # from a per-scope table, result refs (most operands) are resolved
        # inline, and an instruction without attrs or subprograms whose op and
        # operand avals were seen before reuses the earlier inference.
        op, operands = inst.op, inst.operands
        where = f"{self.prefix}instruction {index}"
        known = self.ops.get(op)
        if known is None:
            spec = lookup_op(op, where)
            known = self.ops[op] = (spec, *spec.operand_range())
        spec, lo, hi = known
        n = len(operands)
        if n < lo or (hi is not None and n > hi):
            check_arity(spec, n, where)
        avals, n_results = self.avals, self.n_results
        slots, key = [], [op]
        for ref in operands:
            if type(ref) is ResultRef and ref.result < n_results:
                slot = self.first_result + ref.result
            else:
                slot = self.resolve(ref, where, f"operand {len(slots)}", op)
            slots.append(slot)
            key.append(avals[slot])
        args = tuple(slots)
        key = None if inst.attrs or inst.subprograms else tuple(key)  # (op, *avals)
        inferred = self.inferred.get(key)
        if inferred is None:
            inferred = infer(self.base, spec, inst, [avals[s] for s in args],
                             [self.placeholders[s] for s in args], where)
            if key is not None:
                self.inferred[key] = inferred
        attrs, blocks, out_avals, placeholders = inferred
        out = len(avals)
        avals.extend(out_avals)
        self.placeholders.extend(placeholders)
        self.n_results = n_results + len(out_avals)
        return _step(index, where, spec, attrs, args, out, len(out_avals), blocks)


def lookup_op(name: str, where: str) -> OpSpec:
    """The spec of op ``name``, or a ValidationError with a close-match suggestion."""
    spec = lookup(name)
    if spec is None:
        raise ValidationError(f"unknown op {name!r}{suggest(name)}", where, name)
    return spec


def check_arity(spec: OpSpec, n: int, where: str) -> None:
    """Raise unless ``n`` operands fit the op."""
    lo, hi = spec.operand_range()
    if n < lo or (hi is not None and n > hi):
        raise ValidationError(
            f"expects {spec.describe_arity()} operand(s), found {n}", where, spec.name
        )


def infer(base: Base | None, spec: OpSpec, inst: Instruction, avals: list[AVal],
          placeholders: list[mx.array], where: str):
    """Validate an instruction's attrs and subprograms and infer its results.

    Returns ``(attrs, blocks, result avals, result placeholders)``.
    """
    attrs = _validate_attrs(spec, inst, avals, where)
    unexpected = set(inst.subprograms) - set(spec.subprograms)
    missing = set(spec.subprograms) - set(inst.subprograms)
    if unexpected or missing:
        want = ", ".join(spec.subprograms) or "none"
        raise ValidationError(
            f"takes subprograms ({want}); found ({', '.join(inst.subprograms) or 'none'})",
            where,
            inst.op,
        )
    blocks: dict[str, Block] = {}
    try:
        if spec.subprograms:
            blocks, out_avals = spec.extra["validate_structured"](base, inst, avals, attrs, where)
            results = [_placeholder(a) for a in out_avals]
        elif spec.shape_rule is not None:
            out_avals = list(spec.shape_rule(avals, attrs))
            results = [_placeholder(a) for a in out_avals]
        else:
            results = _as_results(spec.impl(placeholders, attrs), spec,
                                  spec.num_outputs(attrs, len(avals)))
            out_avals = [AVal.of(p) for p in results]
    except ValidationError:
        raise
    except (ValueError, TypeError, RuntimeError, IndexError, KeyError) as exc:
        shapes = ", ".join(str(a) for a in avals) or "no operands"
        raise ValidationError(f"{_clean(exc)} (operands: {shapes})", where, inst.op) from None
    n_out = spec.num_outputs(attrs, len(avals))
    if n_out is not None and len(out_avals) != n_out:
        raise ValidationError(
            f"op produced {len(out_avals)} result(s), its spec declares {n_out}", where, inst.op
        )
    return attrs, blocks, out_avals, results


def _as_results(result: Any, spec: OpSpec, n_out: int) -> list[mx.array]:
    """The results of an implementation as a list. An op declared with exactly
    one output returns an array; every other op returns a sequence of arrays
    (of length one too, e.g. ``split`` into one piece)."""
    if spec.outputs == 1:
        if isinstance(result, mx.array):
            return [result]
        expected = "one mx.array"
    else:
        if isinstance(result, (tuple, list)) and all(isinstance(r, mx.array) for r in result):
            return list(result)  # the count is checked by the caller
        expected = f"a tuple of {n_out} mx.array"
    raise TypeError(f"implementation returned {type(result).__name__}; expected {expected}")


def _validate_attrs(spec: OpSpec, inst: Instruction, avals: list[AVal], where: str) -> Attrs:
    context = {"ndims": [len(a.shape) for a in avals], "avals": avals}
    try:
        return spec.attrs.model_validate(inst.attrs, context=context)
    except pydantic.ValidationError as exc:
        problems = []
        for err in exc.errors():
            # Union members show up in locations as 'function-after[...]' etc.
            parts = [str(p) for p in err["loc"] if not _is_schema_tag(p)]
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                known = ", ".join(spec.attrs.model_fields) or "none"
                msg = f"unknown attribute (known: {known})"
            problems.append(f"attribute {'.'.join(parts)!r}: {msg}" if parts else msg)
        raise ValidationError("; ".join(problems), where, inst.op) from None


def _is_schema_tag(part: Any) -> bool:
    return isinstance(part, str) and ("[" in part or part in ("int", "str", "float", "bool"))


def _clean(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.removeprefix("[").split("] ", 1)[-1] if text.startswith("[") else text


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


def exact_array(value: Any, dtype: mx.Dtype) -> mx.array:
    """``value`` (a scalar or nested list) as an array of ``dtype``, refusing
    anything the conversion would change: ragged lists, fractions for integer
    dtypes, values out of the dtype's range. ValueError says which."""
    name = name_of(dtype)
    try:
        data = np.array(value)
    except ValueError:
        raise ValueError("value is a ragged nested list") from None
    if data.dtype == object:  # integers beyond 64 bits (ragged lists raise above)
        try:
            if not is_floating(dtype):
                raise OverflowError
            data = data.astype(np.float64)
        except (OverflowError, TypeError):
            raise ValueError(f"value out of range for {name}") from None
    if data.dtype.kind not in "biuf":
        raise ValueError(f"cannot convert {type(value).__name__} {value!r:.40} to {name}")
    if is_integer(dtype) or dtype == mx.bool_:
        if data.dtype.kind == "f":
            if not np.all(np.isfinite(data)) or np.any(data != np.round(data)):
                raise ValueError(f"non-integer value for dtype {name}")
        if dtype != mx.bool_ and data.size:
            info = np.iinfo(name)
            if data.min() < info.min or data.max() > info.max:
                raise ValueError(f"value out of range for {name} [{info.min}, {info.max}]")
    if dtype in _FLOAT_MAX and data.dtype.kind in "fiu" and data.size:
        finite = data[np.isfinite(data)].astype(np.float64)
        if finite.size and np.max(np.abs(finite)) > _FLOAT_MAX[dtype]:
            raise ValueError(f"value out of range for {name}")
    if dtype == mx.bfloat16:
        return mx.array(data.astype(np.float32)).astype(dtype)
    return mx.array(data, dtype=dtype)


# Largest finite values of the narrow float dtypes (numpy has no bfloat16).
_FLOAT_MAX = {
    mx.float16: float(np.finfo(np.float16).max),
    mx.bfloat16: 3.3895313892515355e38,
    mx.float32: float(np.finfo(np.float32).max),
}

