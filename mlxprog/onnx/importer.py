"""Turn an ONNX graph into an mlxprog program (:func:`import_model`).

The graph's nodes are converted in order, each by its op type's converter
(:mod:`.registry`), into one :class:`~mlxprog.ProgramBuilder`. A
:class:`~.scope.Scope` holds what each ONNX value name stands for while that
happens: a builder value, a NumPy array known at import (initializers,
``Constant`` nodes, and every node whose inputs are all known, folded at
import by ONNX's own reference evaluator) or a channels-last value
(:class:`~.context.ChannelsLast`). Initializers a program reads become
captures (the returned weights), large folded constants too; small ones
become program constants (:class:`~.state.ImportState`). Shape
computations on symbolic dims fold too, to NumPy object arrays, by the
shape rules the converters declare (:mod:`.shape_rules`), before the
converter runs. Before all that, a BatchNormalization (or a per-channel
constant Mul/Add) after a Conv is folded into the Conv's weight and bias
(:mod:`.fold`). A subgraph (``If``, ``Loop``, ``Scan``) is converted in a
child scope that reads the enclosing graphs' values by name.
``docs/onnx.md`` describes the whole mapping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import onnx
from onnx import numpy_helper

from ..builder import Value
from ..format.program import Program
from . import registry, shape_rules
from .context import ChannelsLast, Context, OnnxImportError
from .fold import fold_conv_affine, fuse_conv_epilogue
from .registry import ConverterSpec
from .scope import Entry, Scope
from .state import ImportState, Shape

#: The opsets imported as they are; older models are converted to
#: :data:`MIN_OPSET` with ``onnx.version_converter`` first.
MIN_OPSET = 13


class Importer:
    """Converts one model; :func:`import_model` is its entry point.
    ``inferred`` is ONNX's shape inference of the model's values (default:
    computed on ``model``)."""

    def __init__(self, model: onnx.ModelProto, name: str,
                 inferred: dict[str, Shape] | None = None):
        self.model = model
        self.state = ImportState(name, default_opset(model),
                                 inferred_shapes(model) if inferred is None else inferred)

    def unsupported(self, graph: onnx.GraphProto, prefix: str = ""
                    ) -> dict[tuple[str, str], list[str]]:
        """(op type, domain) -> the names of the nodes in ``graph`` and its
        subgraphs that the importer does not convert (``#index`` for a node
        without a name; a subgraph's nodes as ``node/attribute/name``)."""
        found: dict[tuple[str, str], list[str]] = {}
        for index, node in enumerate(graph.node):
            name = prefix + (node.name or f"#{index}")
            if not registry.supported(node.op_type, node.domain):
                found.setdefault((node.op_type, node.domain or "ai.onnx"), []).append(name)
            for a in node.attribute:
                for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                    for key, names in self.unsupported(g, f"{name}/{a.name}/").items():
                        found.setdefault(key, []).extend(names)
        return found

    def convert_graph(self, graph: onnx.GraphProto, scope: Scope) -> None:
        """Convert every node of ``graph`` into ``scope``, in order."""
        for init in graph.initializer:
            scope.bind(init.name, Entry.initializer(numpy_helper.to_array(init)))
        for index, node in enumerate(graph.node):
            ctx = Context(scope, node, index)
            spec = registry.find(node.op_type, node.domain)
            rule = spec.shape_rule if spec is not None else None
            results = None
            if self._foldable(ctx):
                results = self._fold(ctx)
            elif rule is not None and shape_rules.applies(ctx, rule):
                results = shape_rules.fold(ctx, rule)
                for out, result in zip(node.output, results or ()):
                    if result.dtype == object:
                        self.state.shape_dtypes[out] = shape_rules.result_dtype(ctx, rule)
            if results is None and spec is None:
                raise ctx.fail("cannot be computed at import, and no converter converts it")
            if results is None:
                results = self._convert(ctx, spec)
            if len(results) > len(node.output):
                raise ctx.fail(f"the converter gave {len(results)} results for "
                               f"{len(node.output)} outputs")
            for k, (out, result) in enumerate(zip(node.output, results)):
                if out and result is not None:
                    try:
                        scope.bind(out, Entry.of(result))
                    except TypeError as e:
                        raise ctx.fail(f"output {k}: {e}") from None

    def _convert(self, ctx: Context, spec: ConverterSpec) -> list[Any]:
        """The node's results by its converter. A layout-free node whose
        tensor inputs are all held channels-last (the others single elements
        or constants per channel) runs on them as they are and its results
        stay channels-last, so a convolution, its activation and the next
        convolution need no transpose between them; a converter with a
        channels-last form runs it when its inputs are all held so."""
        if spec.layout_free and _held_channels_last(ctx, broadcast=True):
            ctx.channels_last = True
            return [ChannelsLast(r) if isinstance(r, Value) else r for r in spec.fn(ctx)]
        if spec.channels_last is not None and _held_channels_last(ctx, broadcast=False):
            results = spec.channels_last(ctx)
            if results is not None:
                return results
        return spec.fn(ctx)

    def _foldable(self, ctx: Context) -> bool:
        """Whether the node is computed at import: every input known at
        import (and numeric), no subgraph, an op that may be folded
        (:func:`.registry.foldable`)."""
        node = ctx.node
        if not registry.foldable(node.op_type, node.domain) or any(
                a.type == onnx.AttributeProto.GRAPH for a in node.attribute):
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
        return [np.asarray(o) for o in outputs]

    def run(self) -> tuple[Program, dict[str, np.ndarray | mx.array]]:
        """Convert the model: the program and its weights."""
        graph = self.model.graph
        missing = self.unsupported(graph)
        if missing:
            raise UnsupportedOpsError(missing)
        scope = Scope(self.state, self.state.b, self.convert_graph)
        initializers = {init.name for init in graph.initializer}
        for spec in graph.input:
            if spec.name not in initializers:
                scope.bind(spec.name, Entry.of(self.state.declare_input(spec)))
        self.convert_graph(graph, scope)
        outputs = [scope.value(out.name) for out in graph.output]
        return self.state.b.build(outputs), dict(self.state.weights)


def _held_channels_last(ctx: Context, broadcast: bool) -> bool:
    """Whether the node's tensor inputs are all held channels-last, with one
    rank; with ``broadcast``, any other input may be a single element or a
    constant broadcast per channel (:meth:`.Scope.channel_constant`)."""
    ranks = set()
    per_channel: list[str] = []  # constants broadcast per channel
    for i in range(ctx.num_inputs):
        if not ctx.has_input(i):
            continue
        name = ctx.node.input[i]
        if ctx.scope.is_channels_last(name):
            ranks.add(len(ctx.scope.shape(name)))
        elif not broadcast:
            return False
        elif any(s != 1 for s in ctx.scope.shape(name)):
            per_channel.append(name)
    if len(ranks) != 1:
        return False
    rank = ranks.pop()
    return all(ctx.scope.channel_constant(name, rank) is not None for name in per_channel)


class UnsupportedOpsError(OnnxImportError):
    """The model uses ops no converter converts: :attr:`ops` maps each
    (op type, domain) to the names of its nodes; the message lists them all."""

    def __init__(self, ops: dict[tuple[str, str], list[str]]):
        self.ops = ops
        listed = "; ".join(f"{op} ({domain}) x{len(names)}: {_names(names)}"
                           for (op, domain), names in sorted(ops.items()))
        super().__init__(f"the model uses ONNX ops mlxprog does not convert: {listed}")


def _names(names: list[str], most: int = 5) -> str:
    shown = ", ".join(names[:most])
    return shown + (f", ... ({len(names) - most} more)" if len(names) > most else "")


def inferred_shapes(model: onnx.ModelProto) -> dict[str, Shape]:
    """Every value's shape by ONNX's shape inference, by name (an int per
    known axis, the ``dim_param`` of a named one, None for an unknown one);
    empty where inference fails (a model it cannot type is still imported:
    this only helps to name dims)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - the importer does without
        return {}
    shapes: dict[str, Shape] = {}

    def visit(graph: onnx.GraphProto) -> None:
        for info in [*graph.value_info, *graph.output, *graph.input]:
            tensor = info.type.tensor_type
            if info.type.HasField("tensor_type") and tensor.HasField("shape"):
                shapes[info.name] = tuple(
                    d.dim_value if d.HasField("dim_value") else d.dim_param or None
                    for d in tensor.shape.dim)
        for node in graph.node:
            for a in node.attribute:
                for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                    visit(g)

    visit(inferred.graph)
    return shapes


def default_opset(model: onnx.ModelProto) -> int:
    """The model's opset of the default ONNX domain; a model of other
    domains only (``ai.onnx.ml``) has no default-domain node, and counts as
    the newest opset this onnx package knows (nothing to convert)."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    if any(n.domain in ("", "ai.onnx") for n in model.graph.node):
        raise OnnxImportError("the model imports no opset of the default ONNX domain, yet "
                              "uses its ops")
    return onnx.defs.onnx_opset_version()


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
    if opset < 7:
        model = _legacy_prelu_slopes(model)
    if opset < MIN_OPSET:
        before = _interface(model.graph)
        try:
            model = onnx.version_converter.convert_version(model, MIN_OPSET)
        except Exception as e:  # noqa: BLE001
            raise OnnxImportError(f"the model's opset {opset} is older than {MIN_OPSET} and "
                                  f"onnx.version_converter cannot convert it: {e}") from None
        # Some adapters change what the model takes (opset 8's Scan loses its
        # batch axis): the program would not take what the model's callers give.
        after = _interface(model.graph)
        changed = [name for name, spec in before.items()
                   if spec and not _same_spec(spec, after.get(name))]
        if changed:
            names = ", ".join(map(repr, changed))
            raise OnnxImportError(f"the model's opset {opset} is older than {MIN_OPSET}, and "
                                  "onnx.version_converter changes the type or shape of its "
                                  f"inputs or outputs {names} to convert it: not supported")
    return model


def _legacy_prelu_slopes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A model of opset 6 or older with each PRelu's 1-D slope made
    ``[C, 1, ..., 1]``: before opset 7 a slope of ``C`` values is per channel
    (axis 1, Caffe2's PRelu), and ``onnx.version_converter`` keeps it as it
    is, where NumPy broadcasting would pair it with the last axis (and fail,
    or be wrong when the last axis happens to have C elements too)."""
    model_copy = onnx.ModelProto()
    model_copy.CopyFrom(model)
    graph = model_copy.graph
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 - without ranks nothing is rewritten
        return model
    ranks = {v.name: len(v.type.tensor_type.shape.dim)
             for v in [*inferred.input, *inferred.value_info, *inferred.output]
             if v.type.tensor_type.HasField("shape")}
    ranks.update({init.name: len(init.dims) for init in graph.initializer})
    nodes = []
    for node in graph.node:
        if (node.op_type == "PRelu" and node.domain in ("", "ai.onnx")
                and ranks.get(node.input[1]) == 1 and ranks.get(node.input[0], 0) > 2):
            per_channel = f"{node.input[1]}.per_channel.{len(nodes)}"
            nodes.append(onnx.helper.make_node(
                "Unsqueeze", [node.input[1]], [per_channel],
                axes=list(range(1, ranks[node.input[0]] - 1))))
            node.input[1] = per_channel
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return model_copy


def _interface(graph: onnx.GraphProto) -> dict[str, tuple | None]:
    """The graph's inputs and outputs: name -> (element type, shape) where
    declared (None for an output left untyped)."""
    specs: dict[str, tuple | None] = {}
    for v in [*graph.input, *graph.output]:
        tensor = v.type.tensor_type
        shape = tensor.shape.SerializeToString() if tensor.HasField("shape") else None
        specs[v.name] = (tensor.elem_type, shape) if tensor.elem_type else None
    return specs


def _same_spec(before: tuple, after: tuple | None) -> bool:
    """Whether a declared input/output type is kept (a shape the original
    leaves out may be added)."""
    return after is not None and after[0] == before[0] and before[1] in (None, after[1])


def import_model(model: onnx.ModelProto | str | Path, name: str | None = None, *,
                 fold_batch_norm: bool = True
                 ) -> tuple[Program, dict[str, np.ndarray | mx.array]]:
    """An ONNX model (a ``ModelProto`` or a ``.onnx`` path) as an mlxprog
    program and its weights (NumPy arrays; bfloat16 ones ``mx.array``s):
    ``mlxprog.compile(program, captures=weights)`` runs it. The program's
    inputs are the graph's inputs in order (initializers excluded), its
    outputs the graph's. ``fold_batch_norm`` folds each inference
    BatchNormalization, and each Mul/Add of a per-channel constant, that
    follows a Conv into the Conv's weight and bias first
    (:func:`.fold.fold_conv_affine`; the weights returned are the folded ones).
    Each Conv followed by an Add of another value (a residual block's
    shortcut) and/or a Relu becomes an onnxruntime ``FusedConv``
    (:func:`.fold.fuse_conv_epilogue`), whose sum and ReLU run in the
    convolution's kernel: the same values."""
    model = load_model(model)
    if fold_batch_norm:
        model = fold_conv_affine(model)
    # Shape inference knows no contrib op: it runs on the graph before fusion.
    shapes = inferred_shapes(model)
    return Importer(fuse_conv_epilogue(model, shapes), name or model.graph.name or "onnx",
                    shapes).run()
