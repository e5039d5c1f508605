"""What a converter sees of the node it converts: :class:`Context`.

A converter reads the node's attributes (:meth:`Context.attr`) and inputs,
either as builder values (:meth:`Context.input`) or, where they are known
at import, as NumPy arrays (:meth:`Context.constant`: initializers,
``Constant`` nodes and everything folded from them, shape computations
included), and emits instructions on :attr:`Context.b`. Errors go through
:meth:`Context.fail`, which names the node.

Shapes known at import may hold symbolic dims: :meth:`Context.shape` gives
an int per static dim and the dim's name (a ``dim_param`` of the graph's
inputs, or an expression of them) per symbolic one, and the shape
computations of such dims (``Shape``, ``Gather``, ``Concat`` ...) fold to
NumPy *object* arrays holding those names, which ``reshape``/``broadcast_to``
attributes take as they are. :meth:`Context.static` insists on integers.
The importer evaluates those shape computations itself, before any
converter (:mod:`.shape_rules`), so a converter only sees shape values in the
inputs that take shapes: a ``Reshape``'s ``shape``, an ``Expand``'s, a
``ConstantOfShape``'s input, a ``Tile``'s ``repeats``, a ``Range``'s bounds
(read them with :meth:`Context.constant` / :meth:`Context.require_constant`;
pass each element as it is, an int or a dim expression, into the builder's
shape attributes). A shape input computed at run time (not foldable) is an
error naming the input: :meth:`Context.require_constant`. Read as data
(:meth:`Context.input`), a shape value is computed at run time, and
:meth:`Context.dtype` gives its ONNX type (int64 from ``Shape``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from ..arrays import name_of
from ..builder import Value
from ..format.program import DimSpec
from .errors import OnnxImportError
from .scope import ChannelsLast, Scope

__all__ = ["ChannelsLast", "Context", "OnnxImportError"]


_REQUIRED = object()


class Context:
    """One node being converted, in its graph's :class:`~.scope.Scope`."""

    def __init__(self, scope: Scope, node: onnx.NodeProto, index: int):
        self.scope = scope
        self.node = node
        self.index = index
        #: The builder scope the node's instructions go into.
        self.b = scope.b
        #: The model's opset of the default ONNX domain.
        self.opset = scope.state.opset
        #: Set by the importer for an elementwise node whose tensor inputs
        #: are all held channels-last: :meth:`input` then gives them that
        #: way, and the importer keeps the results channels-last.
        self.channels_last = False

    # -- where, and failing ----------------------------------------------------

    @property
    def where(self) -> str:
        """The node as errors name it: ``node 12 'conv1' (Conv)``, with its
        subgraph path (``graph / node 3 'loop' (Loop) body / ...``)."""
        name = f" {self.node.name!r}" if self.node.name else ""
        return f"{self.scope.path}node {self.index}{name} ({self.node.op_type})"

    def fail(self, message: str) -> OnnxImportError:
        """An :class:`OnnxImportError` naming the node; ``raise ctx.fail(...)``."""
        return OnnxImportError(f"{self.where}: {message}")

    # -- attributes ----------------------------------------------------------------

    def attr(self, name: str, default: Any = _REQUIRED) -> Any:
        """Attribute ``name`` as Python: ints, floats, strings (decoded),
        lists, tensors as NumPy arrays, graphs as ``GraphProto``; without
        ``default`` a missing attribute is an error naming it."""
        for a in self.node.attribute:
            if a.name == name:
                value = helper.get_attribute_value(a)
                if isinstance(value, bytes):
                    return value.decode("utf-8")
                if isinstance(value, onnx.TensorProto):
                    return onnx.numpy_helper.to_array(value)
                if isinstance(value, list) and value and isinstance(value[0], bytes):
                    return [v.decode("utf-8") for v in value]
                return value
        if default is _REQUIRED:
            raise self.fail(f"attribute {name!r} is required")
        return default

    def choice(self, name: str, allowed: tuple, default: Any = _REQUIRED) -> Any:
        """Attribute ``name``, which must be one of ``allowed``."""
        value = self.attr(name, default)
        if value not in allowed:
            raise self.fail(f"attribute {name}={value!r} is not supported "
                            f"(supported: {', '.join(map(repr, allowed))})")
        return value

    # -- inputs ----------------------------------------------------------------------

    @property
    def num_inputs(self) -> int:
        """How many inputs the node lists (trailing optional ones it leaves
        out are not counted; one it skips in the middle is ``""``)."""
        return len(self.node.input)

    def has_input(self, i: int) -> bool:
        """Whether optional input ``i`` is given."""
        return i < len(self.node.input) and self.node.input[i] != ""

    def _name(self, i: int) -> str:
        if not self.has_input(i):
            raise self.fail(f"input {i} is required")
        return self.node.input[i]

    def input(self, i: int) -> Value:
        """Input ``i`` as a builder value, in ONNX's layout (a constant is
        declared on first use; a channels-last value is transposed back),
        or, for a node the importer runs channels-last
        (:attr:`channels_last`), a channels-last input as it is held and a
        per-channel constant as ``[C]``."""
        name = self._name(i)
        if self.channels_last and self.scope.is_channels_last(name):
            return self.scope.channels_last(name, self.where)
        if self.channels_last and any(s != 1 for s in self.scope.shape(name)):
            # A per-channel constant (the importer checked): [C] broadcasts
            # against [N, *spatial, C].
            rank = max(len(self.scope.shape(n)) for n in self.node.input
                       if n and self.scope.is_channels_last(n))
            array = self.scope.channel_constant(name, rank)
            return self.scope.state.known_value(f"{name}.channels_last", array)
        return self.scope.value(name, self.where)

    def input_channels_last(self, i: int) -> Value:
        """Input ``i`` (``[N, C, *spatial]``) as ``[N, *spatial, C]``: a
        converter result held that way is read as it is."""
        return self.scope.channels_last(self._name(i), self.where)

    def is_channels_last(self, i: int) -> bool:
        """Whether input ``i`` is held channels-last (a converter's
        :class:`ChannelsLast` result)."""
        return self.scope.is_channels_last(self._name(i))

    def input_held(self, i: int) -> Value | ChannelsLast:
        """Input ``i`` as it is held, for a converter that passes it on as
        its result: a :class:`ChannelsLast` for a value held channels-last
        (so it stays so), else :meth:`input`."""
        if self.is_channels_last(i):
            return ChannelsLast(self.input_channels_last(i))
        return self.input(i)

    def constant(self, i: int) -> np.ndarray | None:
        """Input ``i``'s value where it is known at import (an initializer, a
        ``Constant``, a value folded from those), else None; an object array
        where it holds symbolic dims."""
        return self.scope.constant(self._name(i)) if self.has_input(i) else None

    def require_constant(self, i: int, what: str) -> np.ndarray:
        """Input ``i``'s value known at import (``what`` names it in the
        error when it is not: its value decides the program's shapes)."""
        value = self.constant(i)
        if value is None:
            raise self.fail(f"input {i} ({what}, {self.node.input[i]!r}) must be known at "
                            "import: it decides the program's shapes, and here it is "
                            "computed at run time")
        return value

    def static(self, i: int, what: str) -> list[int]:
        """Input ``i`` as a list of integers known at import (no symbolic dims)."""
        value = self.require_constant(i, what)
        if value.dtype == object:
            raise self.fail(f"input {i} ({what}) holds symbolic dims {value.tolist()}; "
                            "only integers known at import are supported here")
        return [int(v) for v in np.asarray(value).reshape(-1)]

    def shape(self, i: int) -> tuple[int | str, ...]:
        """Input ``i``'s shape: ints, and dim names/expressions for symbolic dims."""
        return self.scope.shape(self._name(i))

    def dtype(self, i: int) -> np.dtype:
        """Input ``i``'s element type as a NumPy dtype."""
        return self.scope.dtype(self._name(i))

    def symbolic_shape(self, value: Value, name: str | None = None) -> tuple[int | str, ...]:
        """A builder value's shape with symbolic dims by name or expression
        (``name``: the ONNX value it holds, whose inferred shape helps), as
        :meth:`shape` gives an input's."""
        return self.scope.state.symbolic_shape(value, name)

    @property
    def dims(self) -> Mapping[str, DimSpec]:
        """The program's symbolic dims declared so far, by name."""
        return self.scope.state.b.dims

    def known_value(self, key: str, array: np.ndarray) -> Value:
        """``array``, computed at import, as a builder value: a capture named
        ``folded.<key>`` when it is large, a program constant when small."""
        return self.scope.state.known_value(key, array)

    def scalar(self, value: float | int | bool, like: Value) -> Value:
        """A scalar constant of ``like``'s dtype (so arithmetic with it does
        not promote)."""
        return self.b.constant(value, name_of(like.dtype))

    # -- outputs and subgraphs ---------------------------------------------------

    @property
    def num_outputs(self) -> int:
        """How many outputs the node lists."""
        return len(self.node.output)

    def wants_output(self, i: int) -> bool:
        """Whether output ``i`` is named (an optional output left ``""`` is not)."""
        return i < len(self.node.output) and self.node.output[i] != ""

    def subgraph(self, name: str, outer: Sequence[str] = ()) -> Callable[..., list[Value]]:
        """The graph attribute ``name`` as a function for a builder control
        op's body: called with the body's scope and its arguments (Values,
        in the graph's input order, then one per name of ``outer``), it
        converts the graph there and returns its outputs (in ONNX's layout).

        The graph reads the enclosing graphs' values by name. A builder
        subprogram sees the program's inputs, captures and constants, but
        not the results of the (sub)program it is in: those must come in as
        carry. :meth:`outer_values` names them; pass ``outer=`` those names
        and their values (:meth:`value`) as the last carry operands."""
        return self.scope.subgraph(self.attr(name), f"{self.where} {name}", self.where, outer)

    def outer_values(self, *names: str) -> list[str]:
        """The values of this node's graph that the graph attributes
        ``names`` read and that must be carried into a subprogram (see
        :meth:`subgraph`), in a stable order."""
        needed: list[str] = []
        for name in names:
            needed += [n for n in self.scope.outer_values(self.attr(name)) if n not in needed]
        return needed

    def value(self, name: str) -> Value:
        """The value named ``name`` (in this node's graph or an enclosing
        one) as a builder value, in ONNX's layout."""
        return self.scope.value(name, self.where)

    def inline(self, name: str) -> list[Any]:
        """The graph attribute ``name`` (a graph without inputs, an ``If``
        branch) converted in place, into this node's builder scope: its
        outputs as converter results (values known at import stay known)."""
        return self.scope.inline(self.attr(name), f"{self.where} {name}")
