"""What each ONNX value name of a graph stands for while it is converted:
a :class:`Scope` of :class:`Entry` values.

An entry is one of five kinds (:class:`Kind`): a builder value, a builder
value held channels-last (a converter's :class:`ChannelsLast` result), a
NumPy array known at import, a *shape value* (a NumPy object array of ints
and dim expressions, :mod:`.symbolic`) or a graph initializer (known at
import, declared as a capture once a program reads it). A subgraph (``If``,
``Loop``, ``Scan``) is converted in a child scope that reads the enclosing
graphs' values by name.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from ..builder import Value
from .dtypes import dtype_name, numpy_dtype_of
from .errors import OnnxImportError
from .graph import free_names
from .state import ImportState


@dataclass(frozen=True)
class ChannelsLast:
    """A converter's result held channels-last (``[N, *spatial, C]``, the
    layout of MLX's convolutions and pools) for a logically channels-first
    (``[N, C, *spatial]``, ONNX's) tensor: the next convolution reads it as
    it is, so a chain of convolutions needs no transpose pair between each
    two; any other reader gets it transposed back once."""

    value: Value


class Kind(enum.Enum):
    """What an :class:`Entry` holds."""

    #: A builder value, in ONNX's layout.
    VALUE = "value"
    #: A builder value held channels-last (:class:`ChannelsLast`).
    CHANNELS_LAST = "channels_last"
    #: A numeric NumPy array known at import.
    KNOWN = "known"
    #: A shape value: a NumPy object array of ints and dim expressions.
    SHAPE = "shape"
    #: A graph initializer: known at import, a capture once a program reads it.
    INITIALIZER = "initializer"


@dataclass(frozen=True, eq=False)
class Entry:
    """What one value name stands for: a builder ``value`` (kinds VALUE and
    CHANNELS_LAST) or an ``array`` (the others)."""

    kind: Kind
    value: Value | None = None
    array: np.ndarray | None = None

    @staticmethod
    def of(result: Any) -> Entry:
        """The entry of a converter's result (a Value, a :class:`ChannelsLast`
        or a NumPy array) or of a subgraph argument (a Value)."""
        if isinstance(result, Value):
            return Entry(Kind.VALUE, value=result)
        if isinstance(result, ChannelsLast):
            return Entry(Kind.CHANNELS_LAST, value=result.value)
        if isinstance(result, (np.ndarray, np.generic)):
            array = np.asarray(result)
            return Entry(Kind.SHAPE if array.dtype == object else Kind.KNOWN, array=array)
        raise TypeError(f"a converter result must be a Value, a ChannelsLast or a NumPy "
                        f"array; found {type(result).__name__}")

    @staticmethod
    def initializer(array: np.ndarray) -> Entry:
        """A graph initializer's entry."""
        return Entry(Kind.INITIALIZER, array=array)


#: Converts a graph into a scope: how a scope converts its subgraphs.
GraphConverter = Callable[[onnx.GraphProto, "Scope"], None]


class Scope:
    """The values of one graph (the main graph or a subgraph) while it is
    converted: ``state`` is the model's import, ``b`` the graph's builder
    scope, ``convert`` what converts a subgraph into a child scope,
    ``parent`` the enclosing graph's scope (a subgraph reads its values by
    name), ``path`` the prefix errors name (``""`` for the main graph)."""

    def __init__(self, state: ImportState, b, convert: GraphConverter, path: str = "",
                 parent: Scope | None = None):
        self.state = state
        self.b = b
        self.convert = convert
        self.path = path
        self.parent = parent
        self._entries: dict[str, Entry] = {}
        # Channels-last values transposed back (to ONNX's layout), and shape
        # values computed as tensors, by name: each is built once per scope.
        self._logical: dict[str, Value] = {}

    # -- what names stand for -----------------------------------------------------

    def bind(self, name: str, entry: Entry) -> None:
        """Name ``name`` stands for ``entry``."""
        self._entries[name] = entry

    def lookup(self, name: str) -> Entry:
        """What ``name`` stands for here or in an enclosing graph (KeyError: nothing)."""
        scope: Scope | None = self
        while scope is not None:
            if name in scope._entries:
                return scope._entries[name]
            scope = scope.parent
        raise KeyError(name)

    def find(self, name: str) -> Entry | None:
        """What ``name`` stands for here or in an enclosing graph, or None."""
        try:
            return self.lookup(name)
        except KeyError:
            return None

    def entry(self, name: str, where: str | None = None) -> Entry:
        """What ``name`` stands for; nothing is an error naming ``where``
        (the node reading it; default the graph)."""
        found = self.find(name)
        if found is None:
            raise OnnxImportError(f"{where or f'{self.path}graph'}: value {name!r} is used "
                                  "before any node or input defines it")
        return found

    def value(self, name: str, where: str | None = None) -> Value:
        """``name`` as a builder value in ONNX's layout (a channels-last
        value is transposed back once per scope, and the result reused; a
        shape value is computed as a tensor)."""
        entry = self.entry(name, where)
        if entry.kind is Kind.VALUE:
            return entry.value
        if entry.kind is Kind.CHANNELS_LAST:
            if name not in self._logical:
                rank = len(entry.value.shape)
                self._logical[name] = self.b.transpose(
                    entry.value, axes=[0, rank - 1, *range(1, rank - 1)])
            return self._logical[name]
        if entry.kind is Kind.SHAPE:
            if name not in self._logical:
                self._logical[name] = _shape_tensor(entry.array, self.dtype(name), self.b)
            return self._logical[name]
        return self.state.known_value(name, entry.array,
                                      initializer=entry.kind is Kind.INITIALIZER)

    def channel_constant(self, name: str, rank: int) -> np.ndarray | None:
        """``name``'s value laid out for a channels-last tensor of ``rank``
        where it is a constant that broadcasts per channel (logical shape
        ``[C, 1, ..., 1]`` or ``[1, C, 1, ...]`` against ``[N, C, *spatial]``:
        Caffe2-style scale and bias layers): its values as ``[C]``. None for
        anything else."""
        array = self.constant(name)
        if array is None or array.dtype == object or array.ndim > rank:
            return None
        padded = (1,) * (rank - array.ndim) + tuple(array.shape)
        if padded[0] != 1 or any(s != 1 for s in padded[2:]):
            return None
        return array.reshape(-1)

    def is_channels_last(self, name: str) -> bool:
        """Whether ``name`` is held channels-last."""
        entry = self.find(name)
        return entry is not None and entry.kind is Kind.CHANNELS_LAST

    def channels_last(self, name: str, where: str | None = None) -> Value:
        """``name`` (``[N, C, *spatial]``) as ``[N, *spatial, C]``."""
        entry = self.entry(name, where)
        if entry.kind is Kind.CHANNELS_LAST:
            return entry.value
        value = self.value(name, where)
        rank = len(value.shape)
        return self.b.transpose(value, axes=[0, *range(2, rank), 1])

    def constant(self, name: str) -> np.ndarray | None:
        """``name``'s value where it is known at import, else None."""
        entry = self.find(name)
        return None if entry is None else entry.array

    def shape(self, name: str) -> tuple[int | str, ...]:
        """``name``'s logical shape (symbolic dims by name)."""
        entry = self.entry(name)
        if entry.array is not None:
            return tuple(entry.array.shape)
        layout = None
        if entry.kind is Kind.CHANNELS_LAST:
            rank = len(entry.value.shape)
            layout = [0, rank - 1, *range(1, rank - 1)]
        return self.state.symbolic_shape(entry.value, name, layout)

    def dtype(self, name: str) -> np.dtype:
        """``name``'s element type."""
        entry = self.entry(name)
        if entry.kind is Kind.SHAPE:  # the type ONNX gives it
            return self.state.shape_dtypes.get(name, np.dtype(np.int64))
        if entry.array is not None:
            return entry.array.dtype
        return numpy_dtype_of(entry.value.dtype)

    # -- subgraphs ----------------------------------------------------------------------

    def outer_values(self, graph: onnx.GraphProto) -> list[str]:
        """The names ``graph`` (or a graph nested in it) reads from this scope
        that a builder subprogram cannot see: results of this (sub)program
        (or held channels-last). A subprogram sees the program's inputs,
        captures and constants, but any other value must be passed in as
        carry; these are, in a stable order."""
        needed = []
        for name in sorted(free_names(graph)):
            entry = self.find(name)
            if entry is None:
                continue  # the subgraph's own conversion reports it
            if entry.kind is Kind.CHANNELS_LAST or (
                    entry.kind is Kind.VALUE and entry.value.ref.kind in ("result", "carry")):
                needed.append(name)
        return needed

    def subgraph(self, graph: onnx.GraphProto, path: str, where: str,
                 outer: Sequence[str] = ()):
        """A body function converting ``graph`` in a child scope (see
        :meth:`~.context.Context.subgraph`; errors name ``where``). The
        body's arguments are the graph's inputs, then one per name of
        ``outer`` (the values of this scope the graph reads, passed as
        carry: :meth:`outer_values`)."""
        outer = list(outer)

        def body(sb, *args: Value) -> list[Value]:
            scope = Scope(self.state, sb, self.convert, f"{path} / ", parent=self)
            if len(args) != len(graph.input) + len(outer):
                raise OnnxImportError(f"{where}: subgraph {path} takes {len(graph.input)} "
                                      f"inputs, given {len(args) - len(outer)}")
            for name, arg in zip([*(spec.name for spec in graph.input), *outer], args):
                scope.bind(name, Entry.of(arg))
            self.convert(graph, scope)
            return [scope.value(out.name) for out in graph.output]

        return body

    def inline(self, graph: onnx.GraphProto, path: str) -> list[Any]:
        """``graph`` (which takes no inputs) converted into this scope's
        builder scope, as a child scope: its outputs as converter results
        (values known at import stay known; a channels-last one in ONNX's
        layout)."""
        scope = Scope(self.state, self.b, self.convert, f"{path} / ", parent=self)
        self.convert(graph, scope)
        results = []
        for out in graph.output:
            known = scope.constant(out.name)
            results.append(scope.value(out.name) if known is None else known)
        return results


def _shape_tensor(array: np.ndarray, dtype: np.dtype, b) -> Value:
    """A shape value (ints and dim expressions) computed at run time, as a
    ``dtype`` tensor in builder scope ``b``, for a node that uses it as
    data: a dim expression's value is the size of a ones vector of that
    length, summed (the program's shapes are bound per call, so this is
    exact for every binding)."""
    parts = []
    for element in array.reshape(-1):
        if isinstance(element, str):
            ones = b.full(shape=[element], dtype="int64", value=1)
            parts.append(b.sum(ones, axes=[0]))
        else:
            parts.append(b.constant(int(element), "int64"))
    flat = b.stack(*parts, axis=0) if parts else b.constant([], "int64")
    value = b.reshape(flat, shape=list(array.shape))
    return b.astype(value, dtype=dtype_name(dtype)) if dtype != np.int64 else value
