"""The ONNX op converters, by op type, and what the importer needs to know
of each op: :class:`ConverterSpec`.

A converter turns one ONNX node into builder instructions (see
:class:`~mlxprog.onnx.context.Context`). It is registered with
:func:`converter` beside the others of its family (one module each under
:mod:`mlxprog.onnx.convert`), which declares the op's traits too::

    @converter("Relu", layout_free=True)
    def relu(ctx: Context) -> list:
        x = ctx.input(0)
        return [ctx.b.max(x, ctx.scalar(0, x))]

It returns one entry per node output: a builder ``Value``, a NumPy array
(a value known at import: shape computations fold to these), a
:class:`~mlxprog.onnx.context.ChannelsLast` (a 4-d/5-d value held in the
channels-last layout MLX's convolutions use) or None for an optional output
nobody reads. A model whose opset is older than the importer's
``MIN_OPSET`` is converted with ``onnx.version_converter`` first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import Context
    from .shape_rules import ShapeRule

Converter = Callable[["Context"], list[Any]]


@dataclass(frozen=True)
class ConverterSpec:
    """A registered converter: the ONNX op type and domain it converts,
    the function, and the op's traits:

    - ``layout_free``: it computes each element of its results from the same
      element of its inputs (single elements and per-channel constants
      broadcast), so the importer runs it on inputs held channels-last as
      they are, and its results stay so (:attr:`.Context.channels_last`);
    - ``channels_last``: its form for inputs all held channels-last (none
      broadcast): the results, or None where it does not apply (the
      converter then runs on ONNX's layout);
    - ``shape_rule``: how it computes on shape values at import
      (:mod:`.shape_rules`);
    - ``folded``: whether a node whose inputs are all known at import may be
      computed at import by ONNX's reference evaluator (not for an op whose
      results are random).
    """

    op_type: str
    domain: str
    fn: Converter
    layout_free: bool = False
    channels_last: Converter | None = None
    shape_rule: ShapeRule | None = None
    folded: bool = True


CONVERTERS: dict[tuple[str, str], ConverterSpec] = {}

#: Ops the importer computes at import without a converter: a
#: ``Constant``'s value is its attribute (ONNX's reference evaluator reads it).
COMPUTED_AT_IMPORT = frozenset({("", "Constant")})


def converter(*op_types: str, domain: str = "", layout_free: bool = False,
              channels_last: Converter | None = None, shape_rule: ShapeRule | None = None,
              folded: bool = True) -> Callable[[Converter], Converter]:
    """Register ``fn`` as the converter of ``op_types`` (in ``domain``, the
    default ONNX domain when empty), with the ops' traits (see
    :class:`ConverterSpec`). Registering a type twice is an error."""

    def register(fn: Converter) -> Converter:
        for op_type in op_types:
            key = (domain, op_type)
            if key in CONVERTERS:
                raise ValueError(f"ONNX op {op_type!r} already has a converter "
                                 f"({CONVERTERS[key].fn.__module__})")
            CONVERTERS[key] = ConverterSpec(op_type, domain, fn, layout_free, channels_last,
                                            shape_rule, folded)
        return fn

    return register


def register_made(op_type: str, fn: Converter, doc: str, name: str | None = None,
                  **traits: Any) -> Converter:
    """Register ``fn``, one of a family of converters a factory makes (one
    per ONNX op of a table), as ``op_type``'s converter with ``traits``
    (:func:`converter`'s), with the name (``name``, default the op type in
    lower case) and docstring ``doc`` that a converter written out with
    ``def`` would have."""
    fn.__name__ = name or op_type.lower()
    fn.__doc__ = doc
    return converter(op_type, **traits)(fn)


def _key(op_type: str, domain: str) -> tuple[str, str]:
    return ("" if domain == "ai.onnx" else domain, op_type)


def find(op_type: str, domain: str = "") -> ConverterSpec | None:
    """The converter of ``op_type`` in ``domain`` (``ai.onnx`` counts as the
    default domain), or None."""
    return CONVERTERS.get(_key(op_type, domain))


def supported(op_type: str, domain: str = "") -> bool:
    """Whether the importer converts (or computes at import) ``op_type`` of ``domain``."""
    return find(op_type, domain) is not None or _key(op_type, domain) in COMPUTED_AT_IMPORT


def foldable(op_type: str, domain: str = "") -> bool:
    """Whether a node of ``op_type`` whose inputs are all known at import
    may be computed at import: an op the importer supports, unless its
    converter says not (``folded=False``). The import refuses an op it does
    not support, so none is computed at import either (random ops have no
    converter)."""
    spec = find(op_type, domain)
    return spec.folded if spec is not None else _key(op_type, domain) in COMPUTED_AT_IMPORT
