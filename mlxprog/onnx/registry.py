"""The ONNX op converters, by op type: each turns one ONNX node into
builder instructions (see :class:`~mlxprog.onnx.context.Context`).

A converter is registered with :func:`converter` beside the others of its
family (one module each under :mod:`mlxprog.onnx.convert`)::

    @converter("Relu")
    def relu(ctx: Context) -> list:
        return [ctx.b.maximum(ctx.input(0), 0.0)]

It returns one entry per node output: a builder ``Value``, a NumPy array
(a value known at import: shape computations fold to these), a
:class:`~mlxprog.onnx.context.ChannelsLast` (a 4-d/5-d value held in the
channels-last layout MLX's convolutions use) or None for an optional output
nobody reads. ``since`` is the first opset whose semantics the converter
implements; a model whose opset is older is converted with
``onnx.version_converter`` first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import Context

Converter = Callable[["Context"], list[Any]]


@dataclass(frozen=True)
class ConverterSpec:
    """A registered converter: the ONNX op type (and domain) it converts."""

    op_type: str
    domain: str
    fn: Converter


CONVERTERS: dict[tuple[str, str], ConverterSpec] = {}


def converter(*op_types: str, domain: str = "") -> Callable[[Converter], Converter]:
    """Register ``fn`` as the converter of ``op_types`` (in ``domain``, the
    default ONNX domain when empty). Registering a type twice is an error."""

    def register(fn: Converter) -> Converter:
        for op_type in op_types:
            key = (domain, op_type)
            if key in CONVERTERS:
                raise ValueError(f"ONNX op {op_type!r} already has a converter "
                                 f"({CONVERTERS[key].fn.__module__})")
            CONVERTERS[key] = ConverterSpec(op_type, domain, fn)
        return fn

    return register


def register_made(op_type: str, fn: Converter, doc: str, name: str | None = None) -> Converter:
    """Register ``fn``, one of a family of converters a factory makes (one
    per ONNX op of a table), as ``op_type``'s converter, with the name
    (``name``, default the op type in lower case) and docstring ``doc`` that
    a converter written out with ``def`` would have."""
    fn.__name__ = name or op_type.lower()
    fn.__doc__ = doc
    return converter(op_type)(fn)


def find(op_type: str, domain: str = "") -> ConverterSpec | None:
    """The converter of ``op_type`` in ``domain`` (``ai.onnx`` counts as the
    default domain), or None."""
    return CONVERTERS.get(("" if domain == "ai.onnx" else domain, op_type))
