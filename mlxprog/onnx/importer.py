"""Turn an ONNX graph into an mlxprog program (:func:`import_model`).

The graph's nodes are converted in order, each by its op type's converter
(:mod:`.registry`), into one :class:`~mlxprog.ProgramBuilder`. A
:class:`Scope` holds what each ONNX value name stands for while that
happens: a builder value, a NumPy array known at import (initializers,
``Constant`` nodes, and every node whose inputs are all known, folded at
import by ONNX's own reference evaluator) or a channels-last value
(:class:`~.context.ChannelsLast`). Initializers a program reads become
captures (the returned weights), large folded constants too; small ones
become program constants.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import onnx
from onnx import numpy_helper

from ..builder import ProgramBuilder, Value
from ..format.program import Program
from . import registry
from .context import ChannelsLast, Context, OnnxImportError

#: The opsets imported as they are; older models are converted to
#: :data:`MIN_OPSET` with ``onnx.version_converter`` first.
MIN_OPSET = 13
#: Folded constants with more elements than this become captures (weights)
#: rather than constants written into the program's JSON.
MAX_INLINE_CONSTANT = 256

_ONNX_TO_NUMPY = {
    onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.INT16: np.int16, onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.INT64: np.int64, onnx.TensorProto.UINT8: np.uint8,
    onnx.TensorProto.UINT16: np.uint16, onnx.TensorProto.UINT32: np.uint32,
    onnx.TensorProto.UINT64: np.uint64, onnx.TensorProto.BOOL: np.bool_,
}


def numpy_dtype(elem_type: int, where: str) -> np.dtype:
    """The NumPy dtype of an ONNX element type; one MLX has no counterpart
    for (strings, 8-bit floats, complex128, ...) is an error naming ``where``."""
    if elem_type not in _ONNX_TO_NUMPY:
        name = onnx.TensorProto.DataType.Name(elem_type)
        raise OnnxImportError(f"{where}: element type {name} is not supported "
                              "(MLX has no such dtype)")
    return np.dtype(_ONNX_TO_NUMPY[elem_type])


def dtype_name(dtype: np.dtype) -> str:
    """The program format's name of a NumPy dtype."""
    return "bool" if dtype == np.bool_ else np.dtype(dtype).name


class Scope:
    """The values of one graph (the main graph or a subgraph) while it is
    converted: ``b`` is its builder scope, ``parent`` the enclosing graph's
    scope (a subgraph reads its values by name), ``path`` the prefix errors
    name (``""`` for the main graph)."""

    def __init__(self, importer: Importer, b, path: str = "", parent: Scope | None = None):
        self.importer = importer
        self.b = b
        self.path = path
        self.parent = parent
        self.opset = importer.opset
        self._values: dict[str, Any] = {}

    # -- what names stand for -----------------------------------------------------

    def bind(self, name: str, entry: Any) -> None:
        """Name ``name`` stands for ``entry`` (a Value, a NumPy array, a
        ChannelsLast, or an :class:`Initializer`)."""
        self._values[name] = entry

    def lookup(self, name: str) -> Any:
        """What ``name`` stands for here or in an enclosing graph (KeyError: nothing)."""
        scope: Scope | None = self
        while scope is not None:
            if name in scope._values:
                return scope._values[name]
            scope = scope.parent
        raise KeyError(name)

    def _entry(self, name: str, ctx: Context | None) -> Any:
        try:
            return self.lookup(name)
        except KeyError:
            where = ctx.where if ctx is not None else f"{self.path}graph"
            raise OnnxImportError(f"{where}: value {name!r} is used before any node or "
                                  "input defines it") from None

    def value(self, name: str, ctx: Context | None = None) -> Value:
        """``name`` as a builder value in ONNX's layout."""
        entry = self._entry(name, ctx)
        if isinstance(entry, Value):
            return entry
        if isinstance(entry, ChannelsLast):
            rank = len(entry.value.shape)
            logical = self.b.transpose(entry.value, axes=[0, rank - 1, *range(1, rank - 1)])
            self.bind(name, logical)
            return logical
        array = entry.array if isinstance(entry, Initializer) else entry
        if isinstance(array, np.ndarray) and array.dtype == object:
            raise OnnxImportError(f"{ctx.where if ctx else self.path + 'graph'}: value "
                                  f"{name!r} holds symbolic dims {array.tolist()}, used as "
                                  "a tensor at run time: not supported")
        return self.importer.materialize(name, entry, self)

    def channels_last(self, name: str, ctx: Context | None = None) -> Value:
        """``name`` (``[N, C, *spatial]``) as ``[N, *spatial, C]``."""
        entry = self._entry(name, ctx)
        if isinstance(entry, ChannelsLast):
            return entry.value
        value = self.value(name, ctx)
        rank = len(value.shape)
        return self.b.transpose(value, axes=[0, *range(2, rank), 1])

    def constant(self, name: str) -> np.ndarray | None:
        """``name``'s value where it is known at import, else None."""
        try:
            entry = self.lookup(name)
        except KeyError:
            return None
        if isinstance(entry, Initializer):
            return entry.array
        return entry if isinstance(entry, np.ndarray) else None

    def shape(self, name: str) -> tuple[int | str, ...]:
        """``name``'s logical shape (symbolic dims by name)."""
        entry = self._entry(name, None)
        if isinstance(entry, Initializer):
            return tuple(entry.array.shape)
        if isinstance(entry, np.ndarray):
            return tuple(entry.shape)
        value = entry.value if isinstance(entry, ChannelsLast) else entry
        sizes = self.importer.symbolic_shape(value)
        if isinstance(entry, ChannelsLast):
            sizes = (sizes[0], sizes[-1], *sizes[1:-1])
        return sizes

    def dtype(self, name: str) -> np.dtype:
        """``name``'s element type."""
        entry = self._entry(name, None)
        if isinstance(entry, Initializer):
            return entry.array.dtype
        if isinstance(entry, np.ndarray):
            return entry.dtype
        value = entry.value if isinstance(entry, ChannelsLast) else entry
        return np.dtype(_MLX_TO_NUMPY[value.dtype])

    # -- subgraphs ----------------------------------------------------------------------

    def subgraph(self, graph: onnx.GraphProto, path: str, ctx: Context):
        """A body function converting ``graph`` in a child scope (see
        :meth:`Context.subgraph`)."""
        importer = self.importer

        def body(sb, *args: Value) -> list[Value]:
            scope = Scope(importer, sb, f"{path} / ", parent=self)
            if len(args) != len(graph.input):
                raise ctx.fail(f"subgraph {path} takes {len(graph.input)} inputs, "
                               f"given {len(args)}")
            for spec, arg in zip(graph.input, args):
                scope.bind(spec.name, arg)
            importer.convert_graph(graph, scope)
            return [scope.value(out.name) for out in graph.output]

        return body


#: NumPy dtypes of MLX's.
_MLX_TO_NUMPY = {
    mx.bool_: np.bool_, mx.uint8: np.uint8, mx.uint16: np.uint16, mx.uint32: np.uint32,
    mx.uint64: np.uint64, mx.int8: np.int8, mx.int16: np.int16, mx.int32: np.int32,
    mx.int64: np.int64, mx.float16: np.float16, mx.float32: np.float32,
    mx.float64: np.float64,
}


class Initializer:
    """A graph initializer: known at import (:attr:`array`), declared as a
    capture the first time a program reads it."""

    def __init__(self, name: str, array: np.ndarray):
        self.name = name
        self.array = array


class Importer:
    """Converts one model; :func:`import_model` is its entry point."""

    def __init__(self, model: onnx.ModelProto, name: str):
        self.model = model
        self.opset = default_opset(model)
        self.b = ProgramBuilder(name)
        self.weights: dict[str, np.ndarray] = {}
        self._dims: dict[str, str] = {}  # dim_param -> declared dim name
        self._folded = 0

    # -- values -------------------------------------------------------------------------

    def materialize(self, name: str, entry: Any, scope: Scope) -> Value:
        """A value known at import as a builder value: an initializer or a
        large folded array as a capture (a weight), a small array as a
        program constant. The result replaces the entry in the scope that
        binds it, so it is declared once."""
        if isinstance(entry, Initializer):
            array, capture_name = entry.array, entry.name
        else:
            array, capture_name = entry, f"folded.{name}"
        if isinstance(entry, Initializer) or array.size > MAX_INLINE_CONSTANT:
            if capture_name not in self.weights:
                self.weights[capture_name] = array
                value = self.b.capture(capture_name, list(array.shape), dtype_name(array.dtype))
                self._captures[capture_name] = value
            value = self._captures[capture_name]
        else:
            value = self.b.constant(array.tolist(), dtype_name(array.dtype))
        return value

    _captures: dict[str, Value]

    def symbolic_shape(self, value: Value) -> tuple[int | str, ...]:
        """A value's shape with symbolic dims by name. While building, a
        builder value's shape holds each dim's sample size; the sample sizes
        are distinct per dim, so each maps back to its dim."""
        by_sample = {self.b._sample[d]: d for d in self.b.dims}
        return tuple(by_sample.get(s, s) if self.b.dims else s for s in value.shape)

    # -- the graph ------------------------------------------------------------------------

    def declare_input(self, spec: onnx.ValueInfoProto) -> Value:
        """A graph input as a program input, named dims (``dim_param``) and
        unknown ones as symbolic dims."""
        where = f"graph input {spec.name!r}"
        tensor = spec.type.tensor_type
        if not spec.type.HasField("tensor_type"):
            raise OnnxImportError(f"{where}: only tensor inputs are supported "
                                  f"(found {spec.type.WhichOneof('value')})")
        dtype = numpy_dtype(tensor.elem_type, where)
        shape: list[int | str] = []
        for axis, dim in enumerate(tensor.shape.dim):
            if dim.HasField("dim_value"):
                shape.append(dim.dim_value)
                continue
            param = dim.dim_param or f"{spec.name}_{axis}"
            if param not in self._dims:
                name = re.sub(r"\W", "_", param)
                if not name or name[0].isdigit():
                    name = f"d_{name}"
                while name in self.b.dims:
                    name += "_"
                self._dims[param] = self.b.dim(name)
            shape.append(self._dims[param])
        return self.b.input(spec.name, shape, dtype_name(dtype))

    def unsupported(self, graph: onnx.GraphProto) -> Counter:
        """(op type, domain) -> count of the nodes in ``graph`` and its
        subgraphs that no converter converts."""
        found: Counter = Counter()
        for node in graph.node:
            if registry.find(node.op_type, node.domain) is None:
                found[(node.op_type, node.domain or "ai.onnx")] += 1
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    found += self.unsupported(a.g)
                for g in a.graphs:
                    found += self.unsupported(g)
        return found

    def convert_graph(self, graph: onnx.GraphProto, scope: Scope) -> None:
        """Convert every node of ``graph`` into ``scope``, in order."""
        for init in graph.initializer:
            scope.bind(init.name, Initializer(init.name, numpy_helper.to_array(init)))
        for index, node in enumerate(graph.node):
            ctx = Context(scope, node, index)
            spec = registry.find(node.op_type, node.domain)
            results = self._fold(ctx) if self._foldable(ctx) else None
            if results is None:
                results = spec.fn(ctx)
            if len(results) > len(node.output):
                raise ctx.fail(f"the converter gave {len(results)} results for "
                               f"{len(node.output)} outputs")
            for out, result in zip(node.output, results):
                if out and result is not None:
                    scope.bind(out, result)

    def _foldable(self, ctx: Context) -> bool:
        """Whether the node is computed at import: every input known at
        import (and numeric), no subgraph, not random."""
        node = ctx.node
        if node.op_type in _NEVER_FOLDED or any(a.type == onnx.AttributeProto.GRAPH
                                                for a in node.attribute):
            return False
        given = [i for i in range(ctx.num_inputs) if ctx.has_input(i)]
        values = [ctx.constant(i) for i in given]
        return all(v is not None and v.dtype != object for v in values)

    def _fold(self, ctx: Context) -> list[np.ndarray] | None:
        """The node's outputs computed at import by ONNX's reference
        evaluator (None: it cannot, and the converter runs instead)."""
        from onnx.reference import ReferenceEvaluator

        node = ctx.node
        inputs = {name: ctx.scope.constant(name) for name in node.input if name}
        try:
            evaluator = ReferenceEvaluator(node)
            outputs = evaluator.run(None, inputs)
        except Exception:  # noqa: BLE001 - the converter is the fallback
            return None
        self._folded += 1
        return [np.asarray(o) for o in outputs]

    def run(self) -> tuple[Program, dict[str, np.ndarray]]:
        """Convert the model: the program and its weights."""
        graph = self.model.graph
        missing = self.unsupported(graph)
        if missing:
            listed = "; ".join(f"{op} ({domain}) x{count}"
                               for (op, domain), count in sorted(missing.items()))
            raise OnnxImportError(f"the model uses ONNX ops mlxprog does not convert: {listed}")
        self._captures = {}
        scope = Scope(self, self.b)
        initializers = {init.name for init in graph.initializer}
        for spec in graph.input:
            if spec.name not in initializers:
                scope.bind(spec.name, self.declare_input(spec))
        self.convert_graph(graph, scope)
        outputs = [scope.value(out.name) for out in graph.output]
        return self.b.build(outputs), dict(self.weights)


#: Ops whose result must not be computed at import (random ones).
_NEVER_FOLDED = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                 "Multinomial", "Bernoulli"}


def default_opset(model: onnx.ModelProto) -> int:
    """The model's opset of the default ONNX domain."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    raise OnnxImportError("the model imports no opset of the default ONNX domain")


def load_model(model: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    """The model (a path is read, external data included), checked, and
    converted to :data:`MIN_OPSET` when older."""
    if not isinstance(model, onnx.ModelProto):
        path = Path(model)
        if not path.is_file():
            raise OnnxImportError(f"ONNX model not found: {path}")
        try:
            model = onnx.load(str(path))
        except Exception as e:  # noqa: BLE001 - protobuf's errors vary
            raise OnnxImportError(f"cannot read ONNX model {path}: {e}") from None
    newest = onnx.defs.onnx_opset_version()
    opset = default_opset(model)
    if opset > newest:
        raise OnnxImportError(f"the model's opset {opset} is newer than this onnx package "
                              f"knows ({newest})")
    if opset < MIN_OPSET:
        try:
            model = onnx.version_converter.convert_version(model, MIN_OPSET)
        except Exception as e:  # noqa: BLE001
            raise OnnxImportError(f"the model's opset {opset} is older than {MIN_OPSET} and "
                                  f"onnx.version_converter cannot convert it: {e}") from None
    return model


def import_model(model: onnx.ModelProto | str | Path, name: str | None = None
                 ) -> tuple[Program, dict[str, np.ndarray]]:
    """An ONNX model (a ``ModelProto`` or a ``.onnx`` path) as an mlxprog
    program and its weights: ``mlxprog.compile(program, captures=weights)``
    runs it. The program's inputs are the graph's inputs in order
    (initializers excluded), its outputs the graph's."""
    model = load_model(model)
    return Importer(model, name or model.graph.name or "onnx").run()
