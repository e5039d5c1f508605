"""Validating one instruction list: refs, ops, attributes, operand checks and
shape/dtype inference.

Nothing is traced or evaluated: result shapes come from each op's shape rule
or from running the op on unevaluated MLX placeholders (MLX builds graphs
lazily, so this allocates nothing). Any problem raises
:class:`~mlxprog.errors.ValidationError` naming the instruction, its
subprogram path and the op.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import mlx.core as mx
import pydantic

from ..arrays import AVal
from ..errors import ValidationError
from ..format.paths import StepPath, render, within
from ..format.program import Instruction, Ref, ResultRef
from ..limits import Limits
from ..ops.attrs import Attrs, CheckError, resolve_axes
from ..ops.context import ExecutionContext
from ..ops.registry import OpSpec, lookup, suggest
from .steps import Block, Step, make_step


class Base:
    """The values every block of a program sees (inputs, captures, constants),
    the limits the program is validated under, the context its ops' rules
    are given (the declared world size), and what it has used of them so
    far (instructions, result elements)."""

    def __init__(self, inputs: Sequence[AVal], captures: Sequence[AVal],
                 constants: Sequence[mx.array], limits: Limits | None = None,
                 context: ExecutionContext | None = None):
        self.limits = limits or Limits()
        self.context = context or ExecutionContext()
        self.instructions = 0
        self.elements = 0
        self.n_inputs = len(inputs)
        self.n_captures = len(captures)
        self.n_constants = len(constants)
        self.avals = [*inputs, *captures, *(AVal.of(c) for c in constants)]
        self.placeholders = [
            *(placeholder(a) for a in inputs),
            *(placeholder(a) for a in captures),
            *constants,
        ]


def placeholder(aval: AVal) -> mx.array:
    """An unevaluated array of ``aval``: MLX records the node without allocating."""
    return mx.zeros(aval.shape, aval.dtype)


def result_elements(avals: Sequence[AVal], limits: Limits, what: str, where: str,
                    op: str | None = None) -> int:
    """The elements of ``avals`` together, each within ``limits.max_elements``;
    a ValidationError naming ``what`` (``"result"``, ``"input"``) otherwise."""
    total = 0
    for k, aval in enumerate(avals):
        size = math.prod(aval.shape)
        if size > limits.max_elements:
            raise ValidationError(
                f"{what} {k} is {aval}, {size:,} elements: more than the limit of "
                f"{limits.max_elements:,} (Limits.max_elements)", where, op)
        total += size
    return total


def validate_block(base: Base, instructions: Sequence[Instruction], outputs: Sequence[Ref],
                   carry: Sequence[AVal], path: StepPath) -> Block:
    """Validate one instruction list whose carry values have the given avals.

    Host ops validate their subprograms through this (see :class:`Subprograms`),
    with ``path`` naming the subprogram.
    """
    scope = _Scope(base, carry, path)
    steps = [scope.add(index, inst) for index, inst in enumerate(instructions)]
    where = within(render(path), "outputs")
    out_slots = tuple(scope.resolve(ref, where, f"output {i}") for i, ref in enumerate(outputs))
    return Block(path=path, steps=tuple(steps), n_prefix=len(base.avals), n_carry=len(carry),
                 outputs=out_slots, avals=tuple(scope.avals))


class Subprograms:
    """Validates an instruction's subprograms for its host op's ``infer`` rule
    (see :class:`mlxprog.ops.host.Subprograms`) and keeps their blocks."""

    def __init__(self, base: Base, inst: Instruction, path: StepPath):
        self.base = base
        self.inst = inst
        self.path = path
        self.blocks: dict[str, Block] = {}

    def check(self, name: str, carry: Sequence[AVal]) -> Block:
        """Validate subprogram ``name`` with carry values of these avals."""
        depth = sum(isinstance(part, str) for part in self.path) + 1
        if depth > self.base.limits.max_depth:
            raise CheckError(f"subprograms nest {depth} deep: more than the limit of "
                             f"{self.base.limits.max_depth} (Limits.max_depth)", subprogram=name)
        sub = self.inst.subprograms[name]
        block = validate_block(self.base, sub.instructions, sub.outputs, list(carry),
                               (*self.path, name))
        self.blocks[name] = block
        return block


class _Scope:
    def __init__(self, base: Base, carry: Sequence[AVal], path: StepPath):
        self.base = base
        self.path = path
        self.n_carry = len(carry)
        self.avals: list[AVal] = [*base.avals, *carry]
        self.placeholders: list[mx.array] = [*base.placeholders, *(placeholder(a) for a in carry)]
        self.n_results = 0
        self.first_result = len(self.avals)  # the slot of result 0
        self.prefix = f"{render(path)} > " if path else ""
        # op name -> (spec, min operands, max operands), looked up once per scope
        self.ops: dict[str, tuple[OpSpec, int, int | None]] = {}
        # Instructions without subprograms whose op, operand avals and attrs
        # match infer alike: (op, *avals[, attrs]) -> infer's result, computed once.
        self.inferred: dict[tuple, tuple] = {}

    def where(self, index: int) -> str:
        """The location text of instruction ``index`` of this scope (rendered
        only for messages)."""
        return f"{self.prefix}instruction {index}"

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
            if not self.path:
                raise ValidationError(
                    f"{what} is a carry ref, but carry refs exist only inside subprograms",
                    where, op,
                )
            limit, offset = self.n_carry, len(b.avals)
        else:
            if idx >= self.n_results:
                raise ValidationError(
                    f"{what} refers to result {idx}, but only {self.n_results} result(s) "
                    "exist at this point (a ref may only point to a result already produced)",
                    where, op,
                )
            return self.first_result + idx
        if idx >= limit:
            raise ValidationError(
                f"{what} refers to {kind} {idx}, but there are only {limit} {kind}(s)", where, op,
            )
        return offset + idx

    def add(self, index: int, inst: Instruction) -> Step:
        # This runs once per instruction (100,000 times for a large program), so
        # the common case is kept cheap: the op's spec and operand range come
        # from a per-scope table, result refs (most operands) are resolved
        # inline, and an instruction without subprograms whose op, attrs and
        # operand avals were seen before (a model's layers) reuses the earlier
        # inference: attrs models are frozen and shapes depend on no values.
        op, operands = inst.op, inst.operands
        base = self.base
        base.instructions += 1
        if base.instructions > base.limits.max_instructions:
            raise ValidationError(f"the program has more than {base.limits.max_instructions:,} "
                                  "instructions (Limits.max_instructions)", self.where(index))
        known = self.ops.get(op)
        if known is None:
            spec = lookup_op(op, self.where(index))
            known = self.ops[op] = (spec, *spec.operand_range())
        spec, lo, hi = known
        n = len(operands)
        if n < lo or (hi is not None and n > hi):
            check_arity(spec, n, self.where(index))
        avals, n_results = self.avals, self.n_results
        slots, key = [], [op]
        for ref in operands:
            if type(ref) is ResultRef and ref.result < n_results:
                slot = self.first_result + ref.result
            else:
                slot = self.resolve(ref, self.where(index), f"operand {len(slots)}", op)
            slots.append(slot)
            key.append(avals[slot])
        args = tuple(slots)
        path = (*self.path, index) if self.path else (index,)
        if inst.attrs:
            key.append(repr(inst.attrs))
        key = None if inst.subprograms else tuple(key)  # (op, *avals[, attrs])
        inferred = self.inferred.get(key)
        if inferred is None:
            inferred = infer(base, spec, inst, [avals[s] for s in args],
                             [self.placeholders[s] for s in args], path, base.limits,
                             base.context)
            if key is not None:
                self.inferred[key] = inferred
        attrs, blocks, out_avals, placeholders, elements = inferred
        base.elements += elements
        if base.elements > base.limits.max_total_elements:
            raise ValidationError(
                f"the program's results hold {base.elements:,} elements by here: more than "
                f"the limit of {base.limits.max_total_elements:,} (Limits.max_total_elements)",
                self.where(index), op)
        out = len(avals)
        avals.extend(out_avals)
        self.placeholders.extend(placeholders)
        self.n_results = n_results + len(out_avals)
        return make_step(index, path, spec, attrs, args, out, len(out_avals), blocks)


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
          placeholders: list[mx.array], path: StepPath, limits: Limits,
          context: ExecutionContext):
    """Validate an instruction's attrs, operands and subprograms and infer its
    results: the attrs model, axis resolution, the op's ``check`` rule, then
    the shape rule, the host op's ``infer`` or the implementation on
    placeholders (lazy: nothing is allocated), each result held to
    ``limits``. ``base`` is needed only by host ops with subprograms;
    ``context`` is what the ops that take one are given (the program's
    declared world size).

    Returns ``(attrs, blocks, result avals, result placeholders, elements)``.
    """
    attrs = _validate_attrs(spec, inst, path)
    unexpected = set(inst.subprograms) - set(spec.subprograms)
    missing = set(spec.subprograms) - set(inst.subprograms)
    if unexpected or missing:
        want = ", ".join(spec.subprograms) or "none"
        raise ValidationError(
            f"takes subprograms ({want}); found ({', '.join(inst.subprograms) or 'none'})",
            render(path), inst.op,
        )
    n_out = _num_outputs(spec, attrs, len(avals), path)
    if n_out is not None and n_out > limits.max_results:
        raise ValidationError(f"makes {n_out:,} results: more than the limit of "
                              f"{limits.max_results:,} (Limits.max_results)", render(path),
                              inst.op)
    blocks: dict[str, Block] = {}
    try:
        if spec.axis_fields:
            attrs = resolve_axes(attrs, spec.axis_fields, avals)
        spec.check_operands(avals, attrs, context)
        if spec.host is not None:
            subprograms = Subprograms(base, inst, path)
            out_avals = list(spec.host.infer(subprograms, avals, attrs))
            blocks = subprograms.blocks
            results = [placeholder(a) for a in out_avals]
        elif spec.shape_rule is not None:
            out_avals = spec.result_avals(avals, attrs, context)
            results = [placeholder(a) for a in out_avals]
        else:
            results = None
    except ValidationError:
        raise
    except CheckError as exc:
        raise _check_failure(exc, path, inst.op) from None
    except ValueError as exc:
        raise ValidationError(_clean(exc), render(path), inst.op) from None
    except (TypeError, RuntimeError, IndexError, KeyError, OverflowError) as exc:
        # A rule that fails on operands it did not expect (a user's rule,
        # say) is still reported where it happened.
        raise ValidationError(f"{_clean(exc)} (operands: {_shapes(avals)})", render(path),
                              inst.op) from None
    if results is None:
        try:
            results = _as_results(spec.apply(placeholders, attrs, context), spec, n_out)
        except (ValueError, TypeError, RuntimeError, IndexError, KeyError, OverflowError) as exc:
            raise ValidationError(f"{_clean(exc)} (operands: {_shapes(avals)})", render(path),
                                  inst.op) from None
        out_avals = [AVal.of(p) for p in results]
    if n_out is not None and len(out_avals) != n_out:
        raise ValidationError(
            f"op produced {len(out_avals)} result(s), its spec declares {n_out}", render(path),
            inst.op,
        )
    if len(out_avals) > limits.max_results:
        raise ValidationError(f"makes {len(out_avals):,} results: more than the limit of "
                              f"{limits.max_results:,} (Limits.max_results)", render(path),
                              inst.op)
    elements = result_elements(out_avals, limits, "result", render(path), inst.op)
    return attrs, blocks, out_avals, results, elements


def _num_outputs(spec: OpSpec, attrs: Attrs, n_operands: int, path: StepPath) -> int | None:
    """The op's declared result count (None: its subprograms decide), with a
    user rule that fails reported at the instruction."""
    try:
        return spec.num_outputs(attrs, n_operands)
    except Exception as exc:  # a user's outputs= function is arbitrary code
        raise ValidationError(f"the op's result count could not be computed: {_clean(exc)}",
                              render(path), spec.name) from None


def _shapes(avals: list[AVal]) -> str:
    return ", ".join(str(a) for a in avals) or "no operands"


def _check_failure(exc: CheckError, path: StepPath, op: str) -> ValidationError:
    """A failed operand check as a ValidationError: at the subprogram it names,
    else at the instruction (under the attribute it names)."""
    if exc.subprogram is not None:
        return ValidationError(str(exc), render((*path, exc.subprogram)))
    detail = str(exc) if exc.attribute is None else f"attribute {exc.attribute!r}: {exc}"
    return ValidationError(detail, render(path), op)


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


def _validate_attrs(spec: OpSpec, inst: Instruction, path: StepPath) -> Attrs:
    try:
        return spec.attrs.model_validate(inst.attrs)
    except pydantic.ValidationError as exc:
        problems = []
        for err in _union_arm_errors_dropped(exc.errors()):
            # Union members show up in locations as 'function-after[...]' etc.
            parts = [str(p) for p in err["loc"] if not _is_schema_tag(p)]
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                known = ", ".join(spec.attrs.model_fields) or "none"
                msg = f"unknown attribute (known: {known})"
            problems.append(f"attribute {'.'.join(parts)!r}: {msg}" if parts else msg)
        raise ValidationError("; ".join(problems), render(path), inst.op) from None


def _union_arm_errors_dropped(errors: list[dict]) -> list[dict]:
    """``errors`` without the type mismatches of union arms the value was not
    meant for: where an attribute has other errors too (``2**40`` for an
    ``int | list[int]`` fails the int's bound and is no list), only those
    say what is wrong."""
    def field(err: dict) -> Any:
        return err["loc"][0] if err["loc"] else None

    real = {field(e) for e in errors if not e["type"].endswith("_type")}
    return [e for e in errors if not (e["type"].endswith("_type") and field(e) in real)]


def _is_schema_tag(part: Any) -> bool:
    return isinstance(part, str) and ("[" in part or part.startswith("constrained-")
                                      or part in ("int", "str", "float", "bool"))


def _clean(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.removeprefix("[").split("] ", 1)[-1] if text.startswith("[") else text
