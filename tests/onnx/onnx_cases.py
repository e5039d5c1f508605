"""Single-node and small-graph ONNX cases checked against ONNX's own
reference evaluator, for the converter tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import mlxprog as mp
from mlxprog.onnx import import_model

OPSET = 21


def normal_f32(rng: np.random.Generator):
    """``f32(*shape)``: standard-normal float32 samples of ``shape`` drawn
    from ``rng`` (each test module seeds its own)."""
    return lambda *shape: rng.standard_normal(shape).astype(np.float32)


def i64(*values) -> np.ndarray:
    """An int64 array of ``values``."""
    return np.array(values, np.int64)


def value_info(name: str, array: np.ndarray) -> onnx.ValueInfoProto:
    """A graph input/output typed like ``array``."""
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype),
                                         list(array.shape))


def node_model(op_type: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] = ("y",),
               initializers: Mapping[str, np.ndarray] | None = None, opset: int = OPSET,
               **attrs) -> onnx.ModelProto:
    """A model of one ``op_type`` node: ``inputs`` are graph inputs (their
    arrays give the types), ``initializers`` are node inputs held as
    initializers (after the graph inputs, in order); outputs untyped."""
    initializers = dict(initializers or {})
    node = helper.make_node(op_type, [*inputs, *initializers], list(outputs), **attrs)
    graph = helper.make_graph(
        [node], "case", [value_info(n, a) for n, a in inputs.items()],
        [helper.make_value_info(n, onnx.TypeProto()) for n in outputs],
        [numpy_helper.from_array(a, n) for n, a in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def graph_model(nodes: Sequence[onnx.NodeProto], inputs, outputs: Sequence[str],
                initializers=(), opset: int = OPSET) -> onnx.ModelProto:
    """A model of ``nodes``; ``inputs``: (name, elem type, shape with dim
    names) triples; ``initializers``: (name, array) pairs; outputs untyped."""
    graph = helper.make_graph(
        nodes, "case", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_value_info(n, onnx.TypeProto()) for n in outputs],
        [numpy_helper.from_array(a, n) for n, a in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run_mlxprog(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The model imported, compiled and run on ``inputs`` (NumPy arrays are
    bound as they are: ``mx.array`` would make float64 float32)."""
    program, weights = import_model(model)
    exe = mp.compile(program, captures=dict(weights))
    out = exe(**dict(inputs))
    return [np.array(o) for o in out]


def check_model(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray],
                rtol: float = 1e-5, atol: float = 1e-6) -> list[np.ndarray]:
    """The model's outputs by mlxprog equal the reference evaluator's (values,
    shapes and dtypes); returns mlxprog's."""
    expected = ReferenceEvaluator(model).run(None, dict(inputs))
    ours = run_mlxprog(model, inputs)
    assert len(ours) == len(expected)
    for got, want in zip(ours, expected):
        want = np.asarray(want)
        assert got.shape == want.shape, (got.shape, want.shape)
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return ours


def check_node(op_type: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] = ("y",),
               initializers: Mapping[str, np.ndarray] | None = None, rtol: float = 1e-5,
               atol: float = 1e-6, **attrs) -> list[np.ndarray]:
    """One node checked against the reference evaluator (see :func:`node_model`)."""
    model = node_model(op_type, inputs, outputs, initializers, **attrs)
    return check_model(model, inputs, rtol, atol)
