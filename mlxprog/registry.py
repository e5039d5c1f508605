"""The op registry: op name -> :class:`OpSpec` (attrs model, arity, shape rule,
implementation). Built-in op families live in :mod:`mlxprog.ops`; users add ops
with :func:`register_op`.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import mlx.core as mx

from .attrs import Attrs, NoAttrs


class AVal(NamedTuple):
    """An abstract value: the shape and dtype of an array, without its data."""

    shape: tuple[int, ...]
    dtype: mx.Dtype

    @classmethod
    def of(cls, array: mx.array) -> AVal:
        """The abstract value of an array."""
        return cls(tuple(array.shape), array.dtype)

    def __str__(self) -> str:
        from .dtypes import name_of

        return f"{name_of(self.dtype)}{list(self.shape)}"


Impl = Callable[[list[mx.array], Any], Any]
"""An op implementation: ``impl(operands, attrs)`` returns an array, or a tuple of
arrays for multi-output ops."""

ShapeRule = Callable[[list[AVal], Any], list[AVal]]
"""``rule(operand_avals, attrs)`` returns the result avals."""

NativeCoverage = Callable[[list[AVal], Any], bool]
"""``covers(operand_avals, attrs)``: whether the op's native CPU kernel
computes an instruction (see :mod:`mlxprog.native`)."""


@dataclass(frozen=True)
class OpSpec:
    """Everything the validator, interpreter and docs need to know about an op.

    ``operands`` is the operand count: an int, or ``(min, max)`` with ``max=None``
    for unbounded. ``outputs`` is the result count: an int, a function of
    ``(attrs, n_operands)``, or None when the op's subprograms decide it.
    ``shape_rule`` is optional: without it, validation infers result shapes by
    running ``impl`` on unevaluated placeholder arrays, which MLX builds lazily
    without allocating.

    Host ops (``host=True``: ``while``, ``cond``, ``runtime_call``) end a compiled
    segment; their ``impl`` is a host handler ``impl(runner, step, operands,
    inputs)`` run between segments. They need a ``shape_rule``, or, when they own
    ``subprograms``, a ``validate_structured(base, inst, avals, attrs, where)``
    hook (in ``extra``) returning ``(blocks, result avals)``.

    ``shapeless`` marks an op whose MLX graph stays correct when only its input
    shapes change (elementwise ops, reductions over fixed axes, matmul): a
    segment of such ops in a symbolic program is compiled once with
    ``mx.compile(shapeless=True)`` and serves every binding.

    ``native_coverage``, for an op with a native CPU kernel, says which
    instructions the kernel computes (``mlxprog inspect`` reports it; the
    implementation makes the same decision on the arrays).
    """

    name: str
    impl: Impl
    attrs: type[Attrs]
    operands: int | tuple[int, int | None]
    outputs: int | Callable[[Any, int], int] | None
    shape_rule: ShapeRule | None
    family: str
    doc: str
    subprograms: tuple[str, ...] = ()
    host: bool = False
    shapeless: bool = False
    native_coverage: NativeCoverage | None = None
    extra: dict[str, Any] = field(default_factory=dict)

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
    family: str | None = None,
    subprograms: Sequence[str] = (),
    host: bool = False,
    shapeless: bool = False,
    native_coverage: NativeCoverage | None = None,
    replace: bool = False,
    **extra: Any,
) -> Callable[[Impl], Impl]:
    """Decorator adding an op to the registry.

    >>> class ScaleAttrs(mp.Attrs):
    ...     factor: float = 2.0
    >>> @mp.register_op("scale", attrs=ScaleAttrs)
    ... def scale(operands, attrs):
    ...     return operands[0] * attrs.factor

    The function receives the operand arrays and the validated attrs model and
    returns one array (or a tuple for multi-output ops). Registering a name that
    exists is an error unless ``replace=True``.
    """
    if not isinstance(attrs, type) or not issubclass(attrs, Attrs):
        raise RegistryError(f"op {name!r}: attrs must be a subclass of mlxprog.Attrs")
    if name in _REGISTRY and not replace:
        raise RegistryError(f"op {name!r} is already registered (pass replace=True)")

    def decorate(fn: Impl) -> Impl:
        module = fn.__module__ or ""
        _REGISTRY[name] = OpSpec(
            name=name,
            impl=fn,
            attrs=attrs,
            operands=operands,
            outputs=outputs,
            shape_rule=shape_rule,
            family=family or module.rsplit(".", 1)[-1],
            doc=inspect.cleandoc(fn.__doc__ or ""),
            subprograms=tuple(subprograms),
            host=host,
            shapeless=shapeless,
            native_coverage=native_coverage,
            extra=dict(extra),
        )
        return fn

    return decorate


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
