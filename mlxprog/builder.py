"""Build programs from Python: ``ProgramBuilder``.

>>> b = mp.ProgramBuilder("affine")
>>> x = b.input("x", (2, 3), "float32")
>>> w = b.capture("w", (3, 4), "float32")
>>> y = b.add(b.matmul(x, w), 1.0)
>>> prog = b.build([y])

Each op call validates its attributes and infers its result shape immediately,
so a mistake fails at the line that made it. Python scalars given as operands
become constants of a matching dtype.
"""

from __future__ import annotations

from typing import Any, Sequence

import mlx.core as mx

from .arrays import DTYPES, AVal, is_floating, is_integer, name_of
from .errors import ValidationError
from .format.paths import StepPath, render
from .format.program import Constant, DimSpec, Instruction, Program, Ref, SubProgram, TensorSpec
from .limits import Limits
from .ops.context import ExecutionContext
from .ops.registry import lookup, suggest
from .symbolic.expr import evaluate, is_dim_name, parse_dim
from .symbolic.specialize import builder_sample, specialize_instruction
from .validate import validate
from .validate.block import Base, check_arity, infer, lookup_op, placeholder


class UnknownOpError(ValidationError, AttributeError):
    """``b.<name>(...)`` names no registered op (an AttributeError too, so
    ``hasattr(b, name)`` is False)."""


class Value:
    """A value in a program under construction: a ref plus its shape and dtype.
    Supports ``+ - * / @`` and unary ``-`` as shorthands for the ops."""

    __slots__ = ("builder", "ref", "aval", "placeholder")

    def __init__(self, builder: _Scope, ref: Ref, aval: AVal, placeholder: mx.array):
        self.builder = builder
        self.ref = ref
        self.aval = aval
        self.placeholder = placeholder

    @property
    def shape(self) -> tuple[int, ...]:
        """The value's shape."""
        return self.aval.shape

    @property
    def dtype(self) -> mx.Dtype:
        """The value's dtype."""
        return self.aval.dtype

    @property
    def ndim(self) -> int:
        """The value's rank."""
        return len(self.aval.shape)

    def __repr__(self) -> str:
        return f"Value({self.ref}: {self.aval})"

    def _binary(self, name: str, a: Any, b: Any):
        # Inputs, captures and constants belong to every scope; a result or
        # carry pins the op to the (sub)program that owns it.
        scope = self.builder
        if isinstance(b, Value) and b.ref.kind in ("result", "carry"):
            scope = b.builder
        return scope.op(name, a, b)

    def __add__(self, other): return self._binary("add", self, other)
    def __radd__(self, other): return self._binary("add", other, self)
    def __sub__(self, other): return self._binary("subtract", self, other)
    def __rsub__(self, other): return self._binary("subtract", other, self)
    def __mul__(self, other): return self._binary("multiply", self, other)
    def __rmul__(self, other): return self._binary("multiply", other, self)
    def __truediv__(self, other): return self._binary("divide", self, other)
    def __rtruediv__(self, other): return self._binary("divide", other, self)
    def __matmul__(self, other): return self._binary("matmul", self, other)
    def __neg__(self): return self.builder.op("negate", self)


class _Scope:
    """Instruction list under construction (the program body or a subprogram)."""

    def __init__(self, root: ProgramBuilder, carry: Sequence[AVal], path: StepPath):
        self.root = root
        self.path = path
        self.location = render(path)
        self.instructions: list[Instruction] = []
        self.n_results = 0
        self.carry = [
            Value(self, Ref.of("carry", i), a, placeholder(a)) for i, a in enumerate(carry)
        ]

    def op(self, name: str, *operands: Any, **attrs: Any) -> Value | tuple[Value, ...]:
        """Append an instruction; return its result (a tuple for multi-output ops)."""
        return self.op_with(name, operands, attrs)

    def op_with(self, name: str, operands: Sequence[Any], attrs: dict[str, Any],
                subprograms: dict[str, SubProgram] | None = None) -> Value | tuple[Value, ...]:
        """Like :meth:`op`, with explicit subprograms (used by structured ops)."""
        path = self._next_path()
        where = render(path)
        spec = lookup_op(name, where)
        check_arity(spec, len(operands), where)
        values = self._operands(operands, where)
        inst = Instruction(op=name, operands=[v.ref for v in values], attrs=attrs,
                           subprograms=subprograms or {})
        sample = self.root.at_sample(inst, where)
        # An op applied again with the same attrs to operands of the same
        # avals (a model's next layer) infers alike: the first inference serves.
        key = None if subprograms else (name, repr(sample.attrs), *(v.aval for v in values))
        inferred = self.root._inferred.get(key) if key is not None else None
        if inferred is None:
            inferred = infer(
                # Only structured ops read the base (to validate their subprograms).
                self.root.base() if spec.subprograms else None, spec, sample,
                [v.aval for v in values], [v.placeholder for v in values], path,
                self.root.limits, self.root._context,
            )
            if key is not None:
                self.root._inferred[key] = inferred
        _, _, out_avals, results, _ = inferred
        self.instructions.append(inst)
        outs = tuple(
            Value(self, Ref.of("result", self.n_results + k), aval, ph)
            for k, (aval, ph) in enumerate(zip(out_avals, results))
        )
        self.n_results += len(outs)
        # Ops with a fixed single result return a Value; all others a tuple.
        return outs[0] if spec.outputs == 1 else outs

    def _operands(self, operands: Sequence[Any], where: str) -> list[Value]:
        like = next((o for o in operands if isinstance(o, Value)), None)
        values = []
        for i, operand in enumerate(operands):
            if isinstance(operand, Value):
                if operand.builder.root is not self.root:
                    raise ValidationError(
                        f"operand {i} ({operand.ref}) belongs to another ProgramBuilder", where
                    )
                if operand.builder is not self and operand.ref.kind in ("result", "carry"):
                    raise ValidationError(
                        f"operand {i} ({operand.ref}) belongs to another program or "
                        "subprogram; pass it in as carry",
                        where,
                    )
                values.append(operand)
            elif isinstance(operand, (bool, int, float)):
                values.append(self.root.constant(operand, _scalar_dtype(operand, like)))
            else:
                raise ValidationError(
                    f"operand {i} is a {type(operand).__name__}; expected a Value or a "
                    "Python scalar (use b.constant for arrays)",
                    where,
                )
        return values

    def constant(self, value: Any, dtype: str = "float32") -> Value:
        """Declare a constant in the program's constant table (shared by all scopes)."""
        return self.root.constant(value, dtype)

    # -- structured ops ------------------------------------------------------
    def while_loop(self, cond_fn, body_fn, init: Sequence[Value] | Value,
                   max_iterations: int | None = None) -> tuple[Value, ...]:
        """Append a ``while``: ``cond_fn(sb, *carry)`` returns a bool scalar,
        ``body_fn(sb, *carry)`` returns the new carry (same shapes and dtypes);
        ``sb`` is a sub-builder. Returns the final carry as a tuple."""
        init = [init] if isinstance(init, Value) else list(init)
        avals = [self._operands([v], "while")[0].aval for v in init]
        path = self._next_path()
        cond = self._build_sub(cond_fn, avals, (*path, "cond"))
        body = self._build_sub(body_fn, avals, (*path, "body"))
        attrs = {} if max_iterations is None else {"max_iterations": max_iterations}
        return self.op_with("while", init, attrs, {"cond": cond, "body": body})

    def cond(self, pred: Value, then_fn, else_fn,
             operands: Sequence[Value] = ()) -> tuple[Value, ...]:
        """Append a ``cond``: runs ``then_fn(sb, *operands)`` if ``pred`` is true,
        else ``else_fn(sb, *operands)``; both return outputs of the same shapes
        and dtypes. Returns the taken branch's outputs as a tuple."""
        operands = list(operands)
        avals = [v.aval for v in self._operands(operands, "cond")]
        path = self._next_path()
        then = self._build_sub(then_fn, avals, (*path, "then"))
        other = self._build_sub(else_fn, avals, (*path, "else"))
        return self.op_with("cond", [pred, *operands], {}, {"then": then, "else": other})

    def runtime_call(self, callback: str, operands: Sequence[Value] = (),
                     outputs: Sequence[tuple[Sequence[int], str]] = ()) -> tuple[Value, ...]:
        """Append a ``runtime_call`` to the callback named ``callback``; ``outputs``
        declares each result as ``(shape, dtype)``. Returns the results as a tuple."""
        declared = [{"shape": list(shape), "dtype": dtype} for shape, dtype in outputs]
        return self.op_with("runtime_call", list(operands),
                            {"callback": callback, "outputs": declared})

    def trial(self, fn, carry: Sequence[AVal], name: str = "body") -> list[Value]:
        """The outputs ``fn(sb, *carry)`` gives, built in a subprogram that is
        then dropped (nothing is appended here): how a caller learns the
        shapes and dtypes a subprogram will give before building the op
        that holds it. ``carry`` are the subprogram's carry avals; errors
        name the subprogram ``name`` of the next instruction."""
        sub = _Scope(self.root, carry, (*self._next_path(), name))
        outputs = fn(sub, *sub.carry)
        return [outputs] if isinstance(outputs, Value) else list(outputs)

    def _next_path(self) -> StepPath:
        return (*self.path, len(self.instructions))

    def _build_sub(self, fn, carry: Sequence[AVal], path: StepPath) -> SubProgram:
        sub = _Scope(self.root, carry, path)
        outputs = fn(sub, *sub.carry)
        if isinstance(outputs, Value):
            outputs = [outputs]
        return sub._subprogram(list(outputs))

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if lookup(name) is None:
            raise UnknownOpError(f"unknown op {name!r}{suggest(name)}", "builder", name)

        def call(*operands: Any, **attrs: Any):
            return self.op(name, *operands, **attrs)

        call.__name__ = name
        return call

    def _subprogram(self, outputs: Sequence[Value]) -> SubProgram:
        refs = []
        for i, v in enumerate(outputs):
            if not isinstance(v, Value):
                raise ValidationError(f"output {i} is not a Value", self.location)
            if v.builder.root is not self.root:
                raise ValidationError(f"output {i} ({v.ref}) belongs to another ProgramBuilder",
                                      self.location)
            if v.builder is not self and v.ref.kind in ("result", "carry"):
                raise ValidationError(
                    f"output {i} ({v.ref}) belongs to another program or subprogram",
                    self.location,
                )
            refs.append(v.ref)
        return SubProgram(instructions=self.instructions, outputs=refs)


def _scalar_dtype(value: Any, like: Value | None) -> str:
    if isinstance(value, bool):
        return "bool"
    if like is not None:
        if isinstance(value, int) and (is_integer(like.dtype) or is_floating(like.dtype)):
            return name_of(like.dtype)
        if isinstance(value, float) and is_floating(like.dtype):
            return name_of(like.dtype)
    return "int32" if isinstance(value, int) else "float32"


class ProgramBuilder(_Scope):
    """Builds a :class:`~mlxprog.format.program.Program` op by op. ``b.op(name, ...)``
    or ``b.<name>(...)`` appends an instruction; ``build(outputs)`` returns the
    program. Each instruction is held to ``limits`` (default: :class:`Limits`).
    ``world_size`` declares the number of ranks of a program that uses
    distributed ops (see ``docs/distributed.md``)."""

    def __init__(self, name: str = "", limits: Limits | None = None,
                 world_size: int | None = None):
        if world_size is not None and (isinstance(world_size, bool)
                                       or not isinstance(world_size, int) or world_size < 1):
            raise ValidationError(f"world_size must be an integer >= 1, got {world_size!r}",
                                  "world_size")
        self.name = name
        self.limits = limits or Limits()
        # What the ops' rules are given: the declared world size. Private:
        # b.world_size() is the op of that name.
        self._context = ExecutionContext(world_size=world_size)
        self.dims: dict[str, DimSpec] = {}
        self._sample: dict[str, int] = {}
        self.inputs: list[TensorSpec] = []
        self.captures: list[TensorSpec] = []
        self.constants: list[Constant] = []
        self._values: list[Value] = []  # input, capture, constant values (for placeholders)
        self._constant_cache: dict[tuple, Value] = {}
        # (op, attrs at the sample, *operand avals) -> infer's result.
        self._inferred: dict[tuple, tuple] = {}
        self._base: Base | None = None
        super().__init__(self, (), ())

    def base(self) -> Base:
        """The inputs, captures and constants declared so far (for validation)."""
        if self._base is None:
            by_kind = {"input": [], "capture": [], "const": []}
            for value in sorted(self._values, key=lambda v: v.ref.index):
                by_kind[value.ref.kind].append(value)
            self._base = Base([v.aval for v in by_kind["input"]],
                              [v.aval for v in by_kind["capture"]],
                              [v.placeholder for v in by_kind["const"]], self.limits,
                              self._context)
        return self._base

    def _declare(self, kind: str, table: list, spec, aval: AVal, placeholder: mx.array) -> Value:
        value = Value(self, Ref.of(kind, len(table)), aval, placeholder)
        table.append(spec)
        self._values.append(value)
        self._base = None
        return value

    def dim(self, name: str, min: int = 1, max: int | None = None) -> str:
        """Declare a symbolic dim; returns its name, for input shapes and
        integer attributes (``["B*T", 576]``).

        While building, shapes are inferred at one generic sample value per dim
        (``Value.shape`` shows those sizes); the built program is symbolic.
        """
        if name in self.dims:
            raise ValidationError(f"dim {name!r} is declared twice", "dims")
        if not is_dim_name(name):
            raise ValidationError(f"dim name {name!r} is not an identifier", "dims")
        spec = DimSpec(min=min, max=max)
        self._sample[name] = builder_sample(spec, set(self._sample.values()))
        self.dims[name] = spec
        return name

    @property
    def sample_sizes(self) -> dict[str, int]:
        """The size each dim takes while building (the sample binding shapes
        are inferred at; see :meth:`dim`), by dim name."""
        return dict(self._sample)

    def at_sample(self, inst: Instruction, where: str) -> Instruction:
        """The instruction with dim expressions in its attributes evaluated at
        the sample binding (used for shape inference while building)."""
        if not self.dims:
            return inst
        try:
            return specialize_instruction(inst, self.dims, self._sample)
        except ValueError as exc:
            raise ValidationError(str(exc), where, inst.op) from None

    def input(self, name: str, shape: Sequence[int | str], dtype: str = "float32",
              value_of: str | None = None) -> Value:
        """Declare an input. Shape entries may be dims or dim expressions; an
        input with ``value_of`` receives that dim's value on every call (the
        caller does not pass it)."""
        spec = TensorSpec(name=name, shape=list(shape), dtype=dtype, value_of=value_of)
        where = f"input {len(self.inputs)}"
        if any(s.name == name for s in self.inputs):
            raise ValidationError(f"duplicate input name {name!r}", where)
        try:
            sizes = tuple(evaluate(parse_dim(d, self.dims), self._sample) for d in shape)
        except ValueError as exc:
            raise ValidationError(str(exc), where) from None
        aval = AVal(sizes, DTYPES[dtype])
        return self._declare("input", self.inputs, spec, aval, placeholder(aval))

    def capture(self, name: str, shape: Sequence[int], dtype: str = "float32") -> Value:
        """Declare a capture (a weight bound by name at compile time)."""
        spec = TensorSpec(name=name, shape=list(shape), dtype=dtype)
        if any(s.name == name for s in self.captures):
            raise ValidationError(
                f"duplicate capture name {name!r}", f"capture {len(self.captures)}"
            )
        aval = AVal(tuple(shape), DTYPES[dtype])
        return self._declare("capture", self.captures, spec, aval, placeholder(aval))

    def constant(self, value: Any, dtype: str = "float32") -> Value:
        """Declare a constant (a scalar or nested list); equal constants are shared."""
        if isinstance(value, mx.array):
            value = value.tolist()
        key = (repr(value), dtype)
        if key in self._constant_cache:
            return self._constant_cache[key]
        const = Constant(value=value, dtype=dtype)
        probe = Program(constants=[const])
        array = validate(probe).constants[0]
        result = self._declare("const", self.constants, const, AVal.of(array), array)
        self._constant_cache[key] = result
        return result

    def build(self, outputs: Sequence[Value] | Value, check: bool = True) -> Program:
        """Finish: the program with these outputs, validated (``check=False``
        skips the final whole-program validation, for callers that validate
        the result themselves)."""
        if isinstance(outputs, Value):
            outputs = [outputs]
        body = self._subprogram(outputs)
        program = Program(
            name=self.name,
            world_size=self._context.world_size,
            dims=self.dims,
            inputs=self.inputs,
            captures=self.captures,
            constants=self.constants,
            instructions=body.instructions,
            outputs=body.outputs,
        )
        if check:
            validate(program)
        return program
