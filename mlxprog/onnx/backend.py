"""An ONNX backend (``onnx.backend.base.Backend``) running models through
mlxprog: :class:`MlxprogBackend`.

``MlxprogBackend.prepare(model)`` imports the model
(:func:`~mlxprog.onnx.import_model`), validates the program, optionally
round-trips it through its JSON form (the serialized program is what
mlxprog ships, so the backend tests check that it survives), and compiles
it on the CPU device; the :class:`MlxprogRep` it returns runs it on NumPy
inputs and gives NumPy outputs. This is what ONNX's backend test suite
drives (``onnx.backend.test.BackendTest(MlxprogBackend, __name__)``, see
``tests/onnx/test_backend_nodes.py``)::

    from mlxprog.onnx.backend import MlxprogBackend
    rep = MlxprogBackend.prepare(onnx.load("model.onnx"))
    (y,) = rep.run([x])

``specialize_inputs=True`` (for ONNX's node tests, which feed
shape-deciding tensors such as ``Reshape``'s ``shape`` as graph inputs)
defers the import to :meth:`MlxprogRep.run`: a graph input the importer
needs at import (its error says so), or the graph inputs a value it needs
is computed from, is bound to the value given there as an initializer,
and the model is imported again; one program is compiled per distinct set
of such values.

Only the CPU device is supported: MLX's CPU backend is the one every
platform has (and float64, which ONNX tests use, exists only there).
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Mapping, Sequence
from typing import Any

import mlx.core as mx
import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from ..format.program import Program
from ..runtime.executable import Executable, compile as compile_program
from ..validate import validate
from .dtypes import BFLOAT16
from .errors import OnnxImportError
from .importer import import_model, load_model

#: How the importer's error names an input it needs at import
#: (:meth:`~mlxprog.onnx.context.Context.require_constant`).
_NEEDED_AT_IMPORT = re.compile(r"input \d+ \((?:[^()]|\([^()]*\))*?, '(?P<name>[^']+)'\) must be "
                               r"known at\s+import")

__all__ = ["MlxprogBackend", "MlxprogRep", "SpecializingRep", "prepare", "run_model", "run_node",
           "supports_device"]


def to_mlx(array: Any) -> mx.array:
    """A NumPy array as an ``mx.array`` of the same dtype (``mx.array`` alone
    turns float64 into float32; ml_dtypes' bfloat16 becomes MLX's); NumPy
    scalars stay 0-d; an ``mx.array`` (a bfloat16 weight) as it is."""
    if isinstance(array, mx.array):
        return array
    array = np.asarray(array)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)  # (makes a 0-d array 1-d: not reached for one)
    if array.dtype == np.float64:
        return mx.array(array, dtype=mx.float64)
    return mx.array(array)


def to_numpy(array: mx.array) -> np.ndarray:
    """An ``mx.array`` as a NumPy array of the same dtype: bfloat16 as
    ``ml_dtypes.bfloat16`` (ONNX's NumPy form of it; NumPy's buffer protocol
    does not take MLX's bfloat16), through its bits."""
    if array.dtype == mx.bfloat16:
        return np.array(array.view(mx.uint16), copy=True).view(BFLOAT16)
    return np.array(array, copy=True)


def _is_cpu(device: str) -> bool:
    try:
        return Device(device).type == DeviceType.CPU
    except Exception:  # noqa: BLE001 - onnx raises on names it does not know
        return False


class MlxprogRep(BackendRep):
    """A prepared model: :meth:`run` calls the compiled program.

    ``program`` is the imported :class:`~mlxprog.Program`, ``weights`` its
    captures, ``executable`` the compiled program, ``input_names`` and
    ``output_names`` the graph's (inputs without initializers, in order)."""

    def __init__(self, program: Program, weights: Mapping[str, np.ndarray],
                 executable: Executable, output_names: Sequence[str]):
        self.program = program
        self.weights = dict(weights)
        self.executable = executable
        self.input_names = [spec.name for spec in program.inputs]
        self.output_names = list(output_names)
        # namedtuple fields must be identifiers; ONNX names often are not.
        self._outputs = namedtuple("Outputs", [f"out{i}" for i in range(len(output_names))],
                                   rename=True)

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        """The outputs (NumPy arrays, in graph output order) for ``inputs``:
        a list of arrays in graph input order, a dict by input name, or a
        single array for a one-input model."""
        del kwargs
        if isinstance(inputs, Mapping):
            missing = [n for n in self.input_names if n not in inputs]
            if missing:
                raise ValueError(f"missing inputs: {missing}")
            args = [inputs[n] for n in self.input_names]
        else:
            args = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            if len(args) != len(self.input_names):
                raise ValueError(f"the model takes {len(self.input_names)} inputs "
                                 f"{self.input_names}, given {len(args)}")
        with mx.stream(mx.cpu):
            arrays = [to_mlx(a) for a in args]
            outputs = self.executable(*arrays)
            mx.eval(outputs)
            result = [to_numpy(o) for o in outputs]
        return self._outputs(*result)


class SpecializingRep(BackendRep):
    """A model imported at :meth:`run`, with the graph inputs the importer
    needs at import bound to their given values (see the module docstring).
    :attr:`specialized` names them once known; :attr:`reps` holds one
    :class:`MlxprogRep` per distinct set of their values."""

    def __init__(self, model: onnx.ModelProto, options: Mapping[str, Any]):
        self.model = model
        self.options = dict(options)
        inits = {i.name for i in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self.specialized: list[str] | None = None
        self.reps: dict[bytes, MlxprogRep] = {}

    def _bound(self, values: Mapping[str, np.ndarray], names: Sequence[str]) -> onnx.ModelProto:
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        graph = model.graph
        kept = [i for i in graph.input if i.name not in names]
        del graph.input[:]
        graph.input.extend(kept)
        graph.initializer.extend(onnx.numpy_helper.from_array(np.asarray(values[n]), n)
                                 for n in names)
        return model

    def _sources(self, name: str) -> list[str]:
        """The graph inputs ``name`` is computed from (itself if it is one),
        in graph input order."""
        producers = {}
        for node in self.model.graph.node:
            for out in node.output:
                producers[out] = node
        seen, stack = set(), [name]
        while stack:
            value = stack.pop()
            if value in seen:
                continue
            seen.add(value)
            node = producers.get(value)
            if node is not None:
                stack.extend(i for i in node.input if i)
        return [n for n in self.input_names if n in seen]

    def _key(self, values: Mapping[str, np.ndarray]) -> bytes:
        parts = []
        for n in self.specialized or ():
            a = np.asarray(values[n])
            parts.append(f"{n}:{a.dtype}:{a.shape}:".encode() + a.tobytes())
        return b"|".join(parts)

    def _prepare(self, values: Mapping[str, np.ndarray]) -> MlxprogRep:
        names = list(self.specialized or ())
        while True:
            try:
                model = self._bound(values, names) if names else self.model
                rep = MlxprogBackend.prepare(model, **self.options)
            except OnnxImportError as e:
                match = _NEEDED_AT_IMPORT.search(str(e))
                if self.specialized is not None or match is None:
                    raise
                found = [n for n in self._sources(match["name"]) if n in values and n not in names]
                if not found:
                    raise
                names.extend(found)
                if len(names) == len(self.input_names):
                    raise OnnxImportError(
                        f"{e} (every graph input, {', '.join(names)}, decides the program's "
                        "shapes: nothing would be left to run)") from None
                continue
            self.specialized = names
            return rep

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        if isinstance(inputs, Mapping):
            values = dict(inputs)
        else:
            args = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            if len(args) != len(self.input_names):
                raise ValueError(f"the model takes {len(self.input_names)} inputs "
                                 f"{self.input_names}, given {len(args)}")
            values = dict(zip(self.input_names, args))
        key = self._key(values) if self.specialized is not None else None
        rep = self.reps.get(key) if key is not None else None
        if rep is None:
            rep = self._prepare(values)
            self.reps[self._key(values)] = rep
        return rep.run({n: values[n] for n in rep.input_names}, **kwargs)


class MlxprogBackend(Backend):
    """ONNX models run by mlxprog on MLX's CPU device."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return _is_cpu(device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return _is_cpu(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", *,
                roundtrip: bool = True, eager: bool = False, specialize_inputs: bool = False,
                fold_batch_norm: bool = True, **kwargs: Any) -> MlxprogRep | SpecializingRep:
        """Import, validate and compile ``model`` on the CPU. ``roundtrip``
        serializes the program to JSON and loads it back before compiling;
        ``eager`` compiles it for eager interpretation (no ``mx.compile``).
        ``specialize_inputs`` defers the import to the first ``run``, binding
        the graph inputs the importer needs at import (see the module
        docstring). ``fold_batch_norm`` is :func:`import_model`'s. Other
        keyword arguments (the test runner's ``rtol``/``atol``) are ignored."""
        del kwargs
        if not _is_cpu(device):
            raise RuntimeError(f"mlxprog's ONNX backend runs on the CPU only, not {device!r}")
        if specialize_inputs:
            return SpecializingRep(load_model(model), dict(
                roundtrip=roundtrip, eager=eager, fold_batch_norm=fold_batch_norm))
        model = load_model(model)
        program, weights = import_model(model, fold_batch_norm=fold_batch_norm)
        if roundtrip:
            program = Program.loads(program.to_json())
        with mx.stream(mx.cpu):
            validated = validate(program)
            captures = {k: to_mlx(v) for k, v in weights.items()}
            executable = compile_program(validated, captures=captures, eager=eager)
        return MlxprogRep(program, weights, executable, [o.name for o in model.graph.output])

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple:
        """Run one node on ``inputs`` (arrays in the node's input order, or a
        dict by name) by wrapping it in a model typed from the inputs."""
        names = [n for n in node.input if n]
        if isinstance(inputs, Mapping):
            arrays = [np.asarray(inputs[n]) for n in names]
        else:
            arrays = [np.asarray(a) for a in inputs]
        if len(arrays) != len(names):
            raise ValueError(f"node {node.op_type} takes {len(names)} inputs, given {len(arrays)}")
        graph_inputs = [onnx.helper.make_tensor_value_info(
            n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
            for n, a in zip(names, arrays)]
        graph_outputs = [onnx.helper.make_value_info(n, onnx.TypeProto())
                         for n in node.output if n]
        graph = onnx.helper.make_graph([node], "node", graph_inputs, graph_outputs)
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        model = onnx.helper.make_model(
            graph, opset_imports=[onnx.helper.make_opsetid(node.domain or "", opset)])
        return cls.prepare(model, device, **kwargs).run(arrays)


prepare = MlxprogBackend.prepare
run_model = MlxprogBackend.run_model
run_node = MlxprogBackend.run_node
supports_device = MlxprogBackend.supports_device
