"""Turn an ONNX graph into an mlxprog program (:func:`import_model`).

The graph's nodes are converted in order, each by its op type's converter
(:mod:`.registry`), into one :class:`~mlxprog.ProgramBuilder`. A
:class:`Scope` holds what each ONNX value name stands for while that
happens: a builder value, a NumPy array known at import (initializers,
``Constant`` nodes, and every node whose inputs are all known, folded at
import by ONNX's own reference evaluator) or a channels-last value
(:class:`~.context.ChannelsLast`). Initializers a program reads become
captures (the returned weights), large folded constants too; small ones
become program constants. Shape computations on symbolic dims fold too,
to NumPy object arrays (:mod:`.symbolic`), before any converter runs.
Before all that, a BatchNormalization (or a per-channel constant Mul/Add)
after a Conv is folded into the Conv's weight and bias (:mod:`.fold`).
A subgraph (``If``, ``Loop``, ``Scan``) is converted in a child
:class:`Scope` that reads the enclosing graphs' values by name.
``docs/onnx.md`` describes the whole mapping.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import ml_dtypes
import mlx.core as mx
import numpy as np
import onnx
from onnx import numpy_helper

from ..builder import ProgramBuilder, Value
from ..errors import ProgramError
from ..format.program import Program
from ..symbolic.expr import evaluate, parse
from ..symbolic.specialize import specialize
from ..validate import validate
from . import registry, symbolic
from .context import ChannelsLast, Context, OnnxImportError
from .fold import NEVER_FOLDED, fold_conv_affine, fuse_conv_epilogue
from .graph import free_names

#: The opsets imported as they are; older models are converted to
#: :data:`MIN_OPSET` with ``onnx.version_converter`` first.
MIN_OPSET = 13
#: Symbolic sizes are solved from 2**dims bindings (beyond this many dims,
#: a dim's sample size names the dim, and other sizes are taken as numbers).
MAX_SOLVED_DIMS = 4
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
    # ONNX's NumPy form of bfloat16 (numpy_helper, the reference evaluator).
    onnx.TensorProto.BFLOAT16: ml_dtypes.bfloat16,
}

#: bfloat16 as NumPy holds it (``ml_dtypes``: not a ``np.floating`` subtype).
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def is_float_dtype(dtype: np.dtype) -> bool:
    """Whether a NumPy dtype is a float type, bfloat16 included."""
    return np.issubdtype(dtype, np.floating) or np.dtype(dtype) == BFLOAT16


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
        # Channels-last values transposed back (to ONNX's layout), and shape
        # values computed as tensors, by name: each is built once per scope.
        self._logical: dict[str, Value] = {}

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
            raise OnnxImportError(f"{self._where(ctx)}: value {name!r} is used before any node or "
                                  "input defines it") from None

    def _where(self, ctx: Context | None) -> str:
        return ctx.where if ctx is not None else f"{self.path}graph"

    def value(self, name: str, ctx: Context | None = None) -> Value:
        """``name`` as a builder value in ONNX's layout (a channels-last
        value is transposed back once per scope, and the result reused)."""
        entry = self._entry(name, ctx)
        if isinstance(entry, Value):
            return entry
        if isinstance(entry, ChannelsLast):
            if name not in self._logical:
                rank = len(entry.value.shape)
                self._logical[name] = self.b.transpose(
                    entry.value, axes=[0, rank - 1, *range(1, rank - 1)])
            return self._logical[name]
        if isinstance(entry, np.ndarray) and entry.dtype == object:
            if name not in self._logical:
                self._logical[name] = self.importer.shape_tensor(entry, self.dtype(name), self.b)
            return self._logical[name]
        return self.importer.materialize(name, entry, self)

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
        """Whether ``name`` is held channels-last (:class:`ChannelsLast`)."""
        try:
            return isinstance(self.lookup(name), ChannelsLast)
        except KeyError:
            return False

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
        layout = None
        if isinstance(entry, ChannelsLast):
            rank = len(value.shape)
            layout = [0, rank - 1, *range(1, rank - 1)]
        return self.importer.symbolic_shape(value, name, layout)

    def dtype(self, name: str) -> np.dtype:
        """``name``'s element type."""
        entry = self._entry(name, None)
        if isinstance(entry, Initializer):
            return entry.array.dtype
        if isinstance(entry, np.ndarray):
            if entry.dtype == object:  # a shape value: the type ONNX gives it
                return self.importer.shape_dtypes.get(name, np.dtype(np.int64))
            return entry.dtype
        value = entry.value if isinstance(entry, ChannelsLast) else entry
        return np.dtype(_MLX_TO_NUMPY[value.dtype])

    # -- subgraphs ----------------------------------------------------------------------

    def outer_values(self, graph: onnx.GraphProto) -> list[str]:
        """The names ``graph`` (or a graph nested in it) reads from this scope
        that a builder subprogram cannot see: results of this (sub)program
        (or held channels-last). A subprogram sees the program's inputs,
        captures and constants, but any other value must be passed in as
        carry; these are, in a stable order."""
        needed = []
        for name in sorted(free_names(graph)):
            try:
                entry = self.lookup(name)
            except KeyError:
                continue  # the subgraph's own conversion reports it
            if isinstance(entry, ChannelsLast) or (
                    isinstance(entry, Value) and entry.ref.kind in ("result", "carry")):
                needed.append(name)
        return needed

    def subgraph(self, graph: onnx.GraphProto, path: str, ctx: Context,
                 outer: Sequence[str] = ()):
        """A body function converting ``graph`` in a child scope (see
        :meth:`Context.subgraph`). The body's arguments are the graph's
        inputs, then one per name of ``outer`` (the values of this scope
        the graph reads, passed as carry: :meth:`outer_values`)."""
        importer = self.importer
        outer = list(outer)

        def body(sb, *args: Value) -> list[Value]:
            scope = Scope(importer, sb, f"{path} / ", parent=self)
            if len(args) != len(graph.input) + len(outer):
                raise ctx.fail(f"subgraph {path} takes {len(graph.input)} inputs, "
                               f"given {len(args) - len(outer)}")
            for name, arg in zip([*(spec.name for spec in graph.input), *outer], args):
                scope.bind(name, arg)
            importer.convert_graph(graph, scope)
            return [scope.value(out.name) for out in graph.output]

        return body

    def inline(self, graph: onnx.GraphProto, path: str) -> list[Any]:
        """``graph`` (which takes no inputs) converted into this scope's
        builder scope, as a child scope: its outputs' entries (values known
        at import stay known)."""
        scope = Scope(self.importer, self.b, f"{path} / ", parent=self)
        self.importer.convert_graph(graph, scope)
        results = []
        for out in graph.output:
            entry = scope._entry(out.name, None)
            results.append(entry.array if isinstance(entry, Initializer) else
                           scope.value(out.name) if isinstance(entry, ChannelsLast) else entry)
        return results


#: NumPy dtypes of MLX's.
_MLX_TO_NUMPY = {
    mx.bool_: np.bool_, mx.uint8: np.uint8, mx.uint16: np.uint16, mx.uint32: np.uint32,
    mx.uint64: np.uint64, mx.int8: np.int8, mx.int16: np.int16, mx.int32: np.int32,
    mx.int64: np.int64, mx.float16: np.float16, mx.float32: np.float32,
    mx.float64: np.float64, mx.bfloat16: ml_dtypes.bfloat16,
}


class Initializer:
    """A graph initializer: known at import (:attr:`array`), declared as a
    capture the first time a program reads it."""

    def __init__(self, name: str, array: np.ndarray):
        self.name = name
        self.array = array


class Importer:
    """Converts one model; :func:`import_model` is its entry point."""

    def __init__(self, model: onnx.ModelProto, name: str,
                 inferred: dict[str, tuple[int | str | None, ...]] | None = None):
        self.model = model
        self.opset = default_opset(model)
        self.b = ProgramBuilder(name)
        self.weights: dict[str, np.ndarray | mx.array] = {}
        self._dims: dict[str, str] = {}  # dim_param -> declared dim name
        self._folded = 0
        self._captures: dict[str, Value] = {}
        self._solved: dict[int, tuple[Value, list[int | str]]] = {}
        #: The ONNX element type of each shape value (object array), by name.
        self.shape_dtypes: dict[str, np.dtype] = {}
        #: ONNX's shape inference of every value (subgraphs included), by
        #: name: ``inferred``, else computed on ``model``.
        self.inferred = inferred_shapes(model) if inferred is None else inferred

    # -- values -------------------------------------------------------------------------

    def materialize(self, name: str, entry: Any, scope: Scope) -> Value:
        """A value known at import as a builder value: an initializer or a
        large folded array as a capture (a weight), a small array as a
        program constant. The entry stays (converters still read the array
        through :meth:`Context.constant`); captures and constants are
        declared once, and belong to every builder scope."""
        if isinstance(entry, Initializer):
            array, capture_name = entry.array, entry.name
        else:
            array, capture_name = entry, f"folded.{name}"
        if isinstance(entry, Initializer) or array.size > MAX_INLINE_CONSTANT:
            if capture_name not in self.weights:
                # A bfloat16 weight as an mx.array: mlxprog's bindings take
                # NumPy's ml_dtypes form of it nowhere (they read float32 as
                # bfloat16), and the safetensors writer keeps it bfloat16.
                self.weights[capture_name] = mx.array(array) if array.dtype == BFLOAT16 else array
                value = self.b.capture(capture_name, list(array.shape), dtype_name(array.dtype))
                self._captures[capture_name] = value
            value = self._captures[capture_name]
        else:
            value = self.b.constant(array.tolist(), dtype_name(array.dtype))
        return value

    def shape_tensor(self, array: np.ndarray, dtype: np.dtype, b) -> Value:
        """A shape value (ints and dim expressions) computed at run time, as
        a ``dtype`` tensor in builder scope ``b``, for a node that uses it
        as data: a dim expression's value is the size of a ones vector of
        that length, summed (the program's shapes are bound per call, so
        this is exact for every binding)."""
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

    def symbolic_shape(self, value: Value, name: str | None = None,
                       layout: Sequence[int] | None = None) -> tuple[int | str, ...]:
        """A value's logical shape with symbolic dims by name or expression
        (``layout``: the axes of ``value`` in logical order, for a
        channels-last value).

        While building, a builder value's shape holds sizes at one sample
        binding of the dims, which cannot tell a dim from a number (7 is the
        first sample) nor ``12*N`` from 84. Where ONNX's shape inference
        knows an axis (a number, or an input's ``dim_param``) that answer
        wins; the other axes are solved from the value's sizes at other
        bindings (:func:`solve_sizes`)."""
        sizes = list(value.shape)
        if not self.b.dims:
            return tuple(sizes if layout is None else [sizes[a] for a in layout])
        known = self.inferred.get(name) if name else None
        if layout is not None and known is not None:
            # ONNX's answer is in logical order; ``value``'s axes are not.
            known = tuple(known[layout.index(a)] for a in range(len(layout)))
        if known is not None and len(known) != len(sizes):
            known = None
        shape: list[int | str | None] = []
        for axis, size in enumerate(sizes):
            hint = known[axis] if known is not None else None
            if isinstance(hint, int) and hint == size:
                shape.append(size)
            elif isinstance(hint, str) and hint in self._dims:
                shape.append(self._dims[hint])
            else:
                shape.append(None)
        if None in shape:
            # Converters ask for a shape again and again: solve each value once
            # (the value is kept with its answer, so its id is not reused).
            if id(value) not in self._solved:
                axes = [a for a, d in enumerate(shape) if d is None]
                self._solved[id(value)] = (value, self._solve(value, axes, name))
            solved = list(self._solved[id(value)][1])
            shape = [solved.pop(0) if d is None else d for d in shape]
        return tuple(shape if layout is None else [shape[a] for a in layout])

    def _solve(self, value: Value, axes: list[int], name: str | None) -> list[int | str]:
        """The sizes of ``axes`` of ``value`` as dim expressions, from the
        program built so far specialised at several bindings (a value of a
        subprogram: by its sample sizes, a dim's sample naming the dim)."""
        if value.builder is self.b and len(self.b.dims) <= MAX_SOLVED_DIMS:
            program = self.b.build([value], check=False)

            def sizes_at(bindings: dict[str, int]) -> list[int] | None:
                try:
                    aval = validate(specialize(program, bindings)).out_avals[0]
                except ProgramError:
                    return None
                return [aval.shape[a] for a in axes]

            solved = solve_sizes(sizes_at, dict(self.b._sample))
            if solved is not None:
                return solved
        by_sample = {self.b._sample[d]: d for d in self.b.dims}
        return [by_sample.get(value.shape[a], value.shape[a]) for a in axes]

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

    def unsupported(self, graph: onnx.GraphProto, prefix: str = ""
                    ) -> dict[tuple[str, str], list[str]]:
        """(op type, domain) -> the names of the nodes in ``graph`` and its
        subgraphs that no converter converts (``#index`` for a node without
        a name; a subgraph's nodes as ``node/attribute/name``). ``Constant``,
        ``Shape`` and ``Size`` are always computed at import."""
        found: dict[tuple[str, str], list[str]] = {}
        for index, node in enumerate(graph.node):
            name = prefix + (node.name or f"#{index}")
            if (registry.find(node.op_type, node.domain) is None
                    and not (node.domain in ("", "ai.onnx")
                             and node.op_type in _ALWAYS_FOLDED)):
                found.setdefault((node.op_type, node.domain or "ai.onnx"), []).append(name)
            for a in node.attribute:
                for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                    for key, names in self.unsupported(g, f"{name}/{a.name}/").items():
                        found.setdefault(key, []).extend(names)
        return found

    def convert_graph(self, graph: onnx.GraphProto, scope: Scope) -> None:
        """Convert every node of ``graph`` into ``scope``, in order."""
        for init in graph.initializer:
            scope.bind(init.name, Initializer(init.name, numpy_helper.to_array(init)))
        for index, node in enumerate(graph.node):
            ctx = Context(scope, node, index)
            spec = registry.find(node.op_type, node.domain)
            results = None
            if self._foldable(ctx):
                results = self._fold(ctx)
            elif symbolic.applies(ctx):
                results = symbolic.fold(ctx, self.b.dims)
                for out, result in zip(node.output, results or ()):
                    if result.dtype == object:
                        self.shape_dtypes[out] = symbolic.result_dtype(ctx)
            if results is None and spec is None:
                raise ctx.fail("cannot be computed at import, and no converter converts it")
            if results is None:
                results = self._convert(ctx, spec)
            if len(results) > len(node.output):
                raise ctx.fail(f"the converter gave {len(results)} results for "
                               f"{len(node.output)} outputs")
            for out, result in zip(node.output, results):
                if out and result is not None:
                    scope.bind(out, result)

    def _convert(self, ctx: Context, spec) -> list[Any]:
        """The node's results by its converter; an elementwise node whose
        tensor inputs are all held channels-last (the others scalars) runs
        on them as they are and its results stay channels-last, so a
        convolution, its activation and the next convolution need no
        transpose between them (likewise a Concat of channels along axis 1)."""
        layout = _layout_of_inputs(ctx)
        if layout is None:
            return spec.fn(ctx)
        if ctx.node.op_type == "Concat":
            rank = len(ctx.input_channels_last(0).shape)
            if ctx.attr("axis") % rank != 1:
                return spec.fn(ctx)
            parts = [ctx.input_channels_last(i) for i in range(ctx.num_inputs)]
            return [ChannelsLast(ctx.b.concatenate(*parts, axis=rank - 1))]
        ctx.channels_last = True
        return [ChannelsLast(r) if isinstance(r, Value) else r for r in spec.fn(ctx)]

    def _foldable(self, ctx: Context) -> bool:
        """Whether the node is computed at import: every input known at
        import (and numeric), no subgraph, not random."""
        node = ctx.node
        if node.op_type in NEVER_FOLDED or any(a.type == onnx.AttributeProto.GRAPH
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

    def run(self) -> tuple[Program, dict[str, np.ndarray | mx.array]]:
        """Convert the model: the program and its weights."""
        graph = self.model.graph
        missing = self.unsupported(graph)
        if missing:
            raise UnsupportedOpsError(missing)
        scope = Scope(self, self.b)
        initializers = {init.name for init in graph.initializer}
        for spec in graph.input:
            if spec.name not in initializers:
                scope.bind(spec.name, self.declare_input(spec))
        self.convert_graph(graph, scope)
        outputs = [scope.value(out.name) for out in graph.output]
        return self.b.build(outputs), dict(self.weights)


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


#: Ops the importer computes itself, converter or not (a constant and a
#: shape are always known at import).
_ALWAYS_FOLDED = {"Constant", "Shape", "Size"}


def solve_sizes(sizes_at, sample: dict[str, int]) -> list[int | str] | None:
    """Sizes as dim expressions: ``sizes_at(bindings)`` gives the sizes at a
    binding (None: the program is invalid there). Each size is taken to be
    multilinear in the dims (``B*T+2*T+1``: what reshapes, concatenations and
    slices make of them); it is interpolated from the ``2**k`` bindings with
    each dim at its sample or at a second value, and checked at a third
    binding. None when a binding fails or a size is not of that form."""
    dims = list(sample)
    other = {d: 2 * v + 3 for d, v in sample.items()}
    corners = {}
    for mask in range(2 ** len(dims)):
        binding = {d: other[d] if mask >> k & 1 else sample[d] for k, d in enumerate(dims)}
        sizes = sizes_at(binding)
        if sizes is None:
            return None
        corners[mask] = sizes
    exprs = []
    for axis in range(len(corners[0])):
        poly = _multilinear({m: v[axis] for m, v in corners.items()}, dims, sample, other)
        if poly is None:
            return None
        exprs.append(poly)
    check = {d: 3 * v + 5 for d, v in sample.items()}
    if sizes_at(check) != [evaluate(parse(e), check) for e in exprs]:
        return None
    return [symbolic.dim(e) for e in exprs]


def _multilinear(values: dict[int, int], dims: list[str], low: dict[str, int],
                 high: dict[str, int]) -> str | None:
    """The multilinear polynomial through ``values`` (corner mask -> value;
    bit k of a mask: dim k at ``high``, else at ``low``) as an expression,
    or None when a coefficient is not an integer."""
    # Lagrange basis per dim: x at low is (high - x)/(high - low), at high (x - low)/(high - low).
    poly: dict[frozenset, Fraction] = {}
    for mask, value in values.items():
        terms = {frozenset(): Fraction(value)}
        for k, d in enumerate(dims):
            span = high[d] - low[d]
            # (x - low)/span at high, (high - x)/span at low: a*x + b.
            a, b = (Fraction(1, span), Fraction(-low[d], span)) if mask >> k & 1 else \
                (Fraction(-1, span), Fraction(high[d], span))
            new: dict[frozenset, Fraction] = {}
            for mono, c in terms.items():
                new[mono | {d}] = new.get(mono | {d}, 0) + c * a
                new[mono] = new.get(mono, 0) + c * b
            terms = new
        for mono, c in terms.items():
            poly[mono] = poly.get(mono, 0) + c
    if any(c.denominator != 1 for c in poly.values()):
        return None
    return "+".join("*".join([str(int(c)), *sorted(m)]) for m, c in poly.items() if c) or "0"


def inferred_shapes(model: onnx.ModelProto) -> dict[str, tuple[int | str | None, ...]]:
    """Every value's shape by ONNX's shape inference, by name (an int per
    known axis, the ``dim_param`` of a named one, None for an unknown one);
    empty where inference fails (a model it cannot type is still imported:
    this only helps to name dims)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - the importer does without
        return {}
    shapes: dict[str, tuple[int | str | None, ...]] = {}

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


#: Ops that compute each element from the same element of their inputs
#: (scalars broadcast): run on channels-last inputs, their results are the
#: channels-last layout of theirs. Concat joins channels-last inputs along
#: the channel axis.
_LAYOUT_FREE = {
    "Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Clip", "Elu", "Selu",
    "Celu", "Softplus", "Softsign", "Mish", "Gelu", "ThresholdedRelu", "Shrink", "Neg", "Abs",
    "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Floor", "Ceil", "Round", "Sign", "Identity",
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Concat",
}


def _layout_of_inputs(ctx: Context) -> str | None:
    """``"channels_last"`` when the node is layout-free (:data:`_LAYOUT_FREE`)
    and its tensor inputs are all held channels-last with one rank, any
    other input a single element or a constant broadcast per channel
    (:meth:`Scope.channel_constant`), else None."""
    if ctx.node.op_type not in _LAYOUT_FREE or ctx.node.domain not in ("", "ai.onnx"):
        return None
    ranks = set()
    per_channel: list[str] = []  # constants broadcast per channel
    for i in range(ctx.num_inputs):
        if not ctx.has_input(i):
            continue
        name = ctx.node.input[i]
        if ctx.scope.is_channels_last(name):
            ranks.add(len(ctx.scope.shape(name)))
        elif ctx.node.op_type == "Concat":
            return None
        elif any(s != 1 for s in ctx.scope.shape(name)):
            per_channel.append(name)
    if len(ranks) != 1:
        return None
    rank = ranks.pop()
    if any(ctx.scope.channel_constant(name, rank) is None for name in per_channel):
        return None
    return "channels_last"


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
