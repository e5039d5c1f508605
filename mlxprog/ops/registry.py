"""The op registry: op name -> :class:`OpSpec`, everything the pipeline knows
about an op (its attribute model, arity, rules for each stage and its
implementation). Built-in op families live beside this module; users add ops
with :func:`register_op`.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import mlx.core as mx

from ..arrays import AVal
from .attrs import Attrs, AxisOf, NoAttrs, axis_fields
from .context import ExecutionContext
from .host import HostOp

Impl = Callable[..., Any]
"""An op implementation: ``impl(operands, attrs)`` returns an array, or a tuple of
arrays for multi-output ops; an op registered with ``context=True`` is
called ``impl(operands, attrs, context)`` (an
:class:`~mlxprog.ops.context.ExecutionContext`)."""

ShapeRule = Callable[..., list[AVal]]
"""``rule(operand_avals, attrs)`` (a distributed op's: ``rule(operand_avals,
attrs, context)``) returns the result avals."""

CheckRule = Callable[..., None]
"""``check(operand_avals, attrs)`` (a distributed op's: ``check(operand_avals,
attrs, context)``) raises ValueError (or
:class:`~mlxprog.ops.attrs.CheckError`) when the operands do not fit the op
and its attributes."""

GroupCheck = Callable[[Any, Any], None]
"""``check(attrs, group)`` raises ValueError when an instruction cannot run on
this rank of ``group`` (a :class:`~mlxprog.ops.context.GroupInfo`):
checked at compile, once the group is known."""

DISTRIBUTED_KINDS = ("group", "collective", "point_to_point")
"""How a distributed op uses the process group: ``group`` reads it (rank,
size), ``collective`` ops run on every rank with the same operand shapes,
``point_to_point`` ops pair one rank with another."""

NativeCoverage = Callable[[list[AVal], Any], bool]
"""``covers(operand_avals, attrs)``: whether the op's native CPU kernel
computes an instruction (see :mod:`mlxprog.native`)."""


@dataclass(frozen=True)
class OpSpec:
    """Everything validation, planning, execution and the docs know about an op.

    ``operands`` is the operand count: an int, or ``(min, max)`` with ``max=None``
    for unbounded. ``outputs`` is the result count: an int, a function of
    ``(attrs, n_operands)``, or None when the op's subprograms decide it.

    Validation runs, in order: the ``attrs`` model (attributes alone), axis
    resolution (the model's :class:`~mlxprog.ops.attrs.AxisOf` fields, listed
    in ``axis_fields``), the ``check`` rule (operands against attributes),
    then shape inference: ``shape_rule`` if given, else ``impl`` run on
    unevaluated placeholder arrays (MLX builds them lazily without
    allocating), or for a host op its ``host.infer``.

    ``host`` (a :class:`~mlxprog.ops.host.HostOp`) makes an op run on the host
    between compiled segments; ``subprograms`` names the instruction lists it
    owns.

    ``shapeless`` marks an op whose MLX graph stays correct when only its input
    shapes change (elementwise ops, reductions over fixed axes, matmul): a
    segment of such ops in a symbolic program is compiled once with
    ``mx.compile(shapeless=True)`` and serves every binding.

    ``native_coverage``, for an op with a native CPU kernel, says which
    instructions the kernel computes (``mlxprog inspect`` reports it; the
    implementation makes the same decision on the arrays).

    ``distributed`` (one of :data:`DISTRIBUTED_KINDS`) marks an op that needs
    the program's process group: the program must declare ``world_size``,
    the op is never compiled shapeless, and ``collective`` ops make up the
    digest the ranks compare before the first call. ``group_check`` is its
    compile-time rule against this rank of the group. ``keep`` marks an op
    whose result must be computed even when nothing reads it (``send``): the
    runner ties it to its block's outputs.

    ``context`` marks an op whose implementation takes the
    :class:`~mlxprog.ops.context.ExecutionContext` as a third argument (the
    process group, the native-kernel setting): the interpreter passes the
    executable's, fixed in each trace, and validation (running the
    implementation on placeholders) the program's, which holds only its
    declared world size. A distributed op takes it (its implementation needs
    the group), and so do its ``check`` and ``shape_rule``, which check
    against the declared world size. Call them through :meth:`apply`,
    :meth:`check_operands` and :meth:`result_avals`, which pass the context
    only where it is taken.
    """

    name: str
    impl: Impl | None
    attrs: type[Attrs]
    operands: int | tuple[int, int | None]
    outputs: int | Callable[[Any, int], int] | None
    family: str
    doc: str
    shape_rule: ShapeRule | None = None
    check: CheckRule | None = None
    subprograms: tuple[str, ...] = ()
    host: HostOp | None = None
    shapeless: bool = False
    native_coverage: NativeCoverage | None = None
    axis_fields: tuple[tuple[str, AxisOf], ...] = ()
    distributed: str | None = None
    group_check: GroupCheck | None = None
    keep: bool = False
    context: bool = False

    def apply(self, operands: list[mx.array], attrs: Any, context: ExecutionContext) -> Any:
        """The implementation's results on ``operands`` (an array, or a
        tuple of arrays for a multi-output op)."""
        if self.context:
            return self.impl(operands, attrs, context)
        return self.impl(operands, attrs)

    def check_operands(self, avals: list[AVal], attrs: Any, context: ExecutionContext) -> None:
        """Run the ``check`` rule, if any (it raises when the operands do not fit)."""
        if self.check is None:
            return
        if self.distributed is not None:
            self.check(avals, attrs, context)
        else:
            self.check(avals, attrs)

    def result_avals(self, avals: list[AVal], attrs: Any,
                     context: ExecutionContext) -> list[AVal]:
        """The ``shape_rule``'s result avals (the op must have one)."""
        if self.distributed is not None:
            return list(self.shape_rule(avals, attrs, context))
        return list(self.shape_rule(avals, attrs))

    def operand_range(self) -> tuple[int, int | None]:
        """(min, max) operand count; max is None when unbounded."""
        if isinstance(self.operands, int):
            return self.operands, self.operands
        return self.operands

    def describe_arity(self) -> str:
        """The operand count in words, e.g. ``"2"``, ``"1 or more"``, ``"1 to 3"``."""
        lo, hi = self.operand_range()
        if lo == hi:
            return str(lo)
        if hi is None:
            return f"{lo} or more"
        return f"{lo} to {hi}"

    def num_outputs(self, attrs: Any, n_operands: int) -> int | None:
        """How many results an instruction of this op produces (None: decided
        by its subprograms)."""
        if callable(self.outputs):
            return self.outputs(attrs, n_operands)
        return self.outputs


_REGISTRY: dict[str, OpSpec] = {}


class RegistryError(ValueError):
    """Registering an op failed: a duplicate name or an invalid declaration."""


def register_op(
    name: str,
    *,
    attrs: type[Attrs] = NoAttrs,
    operands: int | tuple[int, int | None] = 1,
    outputs: int | Callable[[Any, int], int] | None = 1,
    shape_rule: ShapeRule | None = None,
    check: CheckRule | None = None,
    family: str | None = None,
    doc: str | None = None,
    shapeless: bool = False,
    native_coverage: NativeCoverage | None = None,
    distributed: str | None = None,
    group_check: GroupCheck | None = None,
    keep: bool = False,
    context: bool = False,
    replace: bool = False,
) -> Callable[[Impl], Impl]:
    """Decorator adding an op to the registry.

    >>> class ScaleAttrs(mp.Attrs):
    ...     factor: float = 2.0
    >>> @mp.register_op("scale", attrs=ScaleAttrs)
    ... def scale(operands, attrs):
    ...     return operands[0] * attrs.factor

    The function receives the operand arrays and the validated attrs model and
    returns one array (or a tuple for multi-output ops); its docstring is the
    op's entry in the op reference (``doc`` overrides it). ``check`` is the
    op's operand rule (see :class:`OpSpec`, also for ``distributed``,
    ``group_check``, ``keep`` and ``context``: with ``context=True`` the
    function gets the :class:`~mlxprog.ops.context.ExecutionContext` as a
    third argument, as do a distributed op's ``check`` and ``shape_rule``).
    Registering a name that exists is an error unless ``replace=True``.
    """
    _check_new(name, attrs, replace)
    if distributed is not None and distributed not in DISTRIBUTED_KINDS:
        raise RegistryError(f"op {name!r}: distributed must be one of "
                            f"{', '.join(DISTRIBUTED_KINDS)}, got {distributed!r}")
    if distributed is not None and shapeless:
        # MLX cannot infer a collective's output shape in a shapeless trace.
        raise RegistryError(f"op {name!r}: a distributed op cannot be shapeless")
    if distributed is not None and not context:
        raise RegistryError(f"op {name!r}: a distributed op takes the execution context "
                            "(its process group): register it with context=True")

    def decorate(fn: Impl) -> Impl:
        _add(OpSpec(
            name=name, impl=fn, attrs=attrs, operands=operands, outputs=outputs,
            family=family or (fn.__module__ or "").rsplit(".", 1)[-1],
            doc=inspect.cleandoc(doc if doc is not None else fn.__doc__ or ""),
            shape_rule=shape_rule, check=check, shapeless=shapeless,
            native_coverage=native_coverage, distributed=distributed,
            group_check=group_check, keep=keep, context=context,
        ))
        return fn

    return decorate


def register_host_op(name: str, host: HostOp, *, attrs: type[Attrs] = NoAttrs,
                     operands: int | tuple[int, int | None] = 1,
                     outputs: int | Callable[[Any, int], int] | None = 1,
                     subprograms: Sequence[str] = (), family: str = "control",
                     replace: bool = False) -> None:
    """Add a host op (see :mod:`mlxprog.ops.host`): ``host`` holds its rules
    and its class docstring is the op's entry in the op reference."""
    _check_new(name, attrs, replace)
    if not isinstance(host, HostOp):
        raise RegistryError(f"op {name!r}: host must be a mlxprog.ops.host.HostOp")
    _add(OpSpec(
        name=name, impl=None, attrs=attrs, operands=operands, outputs=outputs,
        family=family, doc=inspect.cleandoc(type(host).__doc__ or ""),
        subprograms=tuple(subprograms), host=host,
    ))


def register_family(members: Mapping[str, tuple[Callable, str]],
                    apply: Callable[..., Any], **options: Any) -> None:
    """Register ops that differ only in the ``mx`` function they call:
    ``members`` maps each op name to ``(function, doc)``, and each op's
    implementation is ``apply(function, operands, attrs)`` (with
    ``context=True``: ``apply(function, operands, attrs, context)``).
    ``options`` are :func:`register_op`'s; the family is ``apply``'s module."""
    options.setdefault("family", apply.__module__.rsplit(".", 1)[-1])
    takes_context = options.get("context", False)
    for name, (function, doc) in members.items():
        if takes_context:
            def impl(operands, attrs, context, function=function):
                return apply(function, operands, attrs, context)
        else:
            def impl(operands, attrs, function=function):
                return apply(function, operands, attrs)

        # The op belongs to the module that declared the family (the docs
        # tell built-in ops from user ones by it).
        impl.__name__ = impl.__qualname__ = name
        impl.__module__ = apply.__module__
        register_op(name, doc=doc, **options)(impl)


def _check_new(name: str, attrs: Any, replace: bool) -> None:
    if not isinstance(attrs, type) or not issubclass(attrs, Attrs):
        raise RegistryError(f"op {name!r}: attrs must be a subclass of mlxprog.Attrs")
    if name in _REGISTRY and not replace:
        raise RegistryError(f"op {name!r} is already registered (pass replace=True)")


def _add(spec: OpSpec) -> None:
    """Store an op, with its attribute model's axis fields found once."""
    fields = axis_fields(spec.attrs)
    _REGISTRY[spec.name] = spec if not fields else OpSpec(
        **{**spec.__dict__, "axis_fields": fields})


def unregister_op(name: str) -> None:
    """Remove an op (used by tests of user-registered ops)."""
    _REGISTRY.pop(name, None)


def lookup(name: str) -> OpSpec | None:
    """The spec of a registered op, or None."""
    return _REGISTRY.get(name)


def suggest(name: str) -> str:
    """A ``"did you mean ...?"`` hint for an unknown op name ('' when nothing is close)."""
    close = difflib.get_close_matches(name, _REGISTRY, n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"


def all_ops() -> dict[str, OpSpec]:
    """A snapshot of the registry, sorted by family then name."""
    return dict(sorted(_REGISTRY.items(), key=lambda kv: (kv[1].family, kv[0])))
