"""ONNX's node test suite (``onnx.backend.test``, 1,884 single-node cases
generated in memory by onnx 1.23) run through mlxprog's ONNX backend:
each case is imported, validated, round-tripped through the program's JSON,
run on the CPU (eagerly: see ``EAGER``) and checked against the expected
outputs (count, shape, dtype, values at the case's rtol/atol).

The node cases feed shape-deciding tensors (``Reshape``'s shape,
``Slice``'s starts, ...) as graph inputs; the backend runs them with
``specialize_inputs=True``, which binds such an input to its given value at
import. What does not run is listed with its reason in ``exclusions.py``
(``NODE_EXCLUDE``, skipped; ``NODE_XFAIL``, strict xfail);
``python tests/onnx/exclusions.py --refresh`` rewrites both from a run.
"""

import os
import warnings

import onnx.backend.test
import pytest

import exclusions  # noqa: I001
from mlxprog.onnx.backend import MlxprogBackend


#: The node cases run the program eagerly (no ``mx.compile``): compiled, MLX
#: fuses each case's elementwise ops into a C++ kernel built with the system
#: compiler on first use (about 0.6 s per distinct kernel, cached under
#: ``$TMPDIR/mlx``), which for ~1,000 distinct small graphs is most of the
#: suite's time on a cold cache. The op semantics are the same either way;
#: the model suite runs compiled. MLXPROG_ONNX_NODE_COMPILED=1 compiles here too.
EAGER = not os.environ.get("MLXPROG_ONNX_NODE_COMPILED")


class NodeBackend(MlxprogBackend):
    """The backend as the node cases need it (see the module docstring)."""

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        kwargs.pop("rtol", None)
        kwargs.pop("atol", None)
        kwargs.setdefault("eager", EAGER)
        return MlxprogBackend.prepare(model, device, specialize_inputs=True, **kwargs)


with warnings.catch_warnings():  # the cases' generators divide by zero on purpose
    warnings.simplefilter("ignore")
    backend_test = onnx.backend.test.BackendTest(NodeBackend, __name__)
# Only the node cases here (test_backend_models.py runs the model ones), and
# only the CPU variants (the CUDA ones would only skip themselves).
_cases = {name: cls for name, cls in backend_test.test_cases.items()
          if name == "OnnxBackendNodeModelTest"}
_cls = _name = None
for _cls in _cases.values():
    for _name in [n for n in vars(_cls) if n.endswith("_cuda")]:
        delattr(_cls, _name)
if not os.environ.get("MLXPROG_ONNX_NODE_ALL"):
    # MLXPROG_ONNX_NODE_ALL=1 runs every case, exclusions included.
    exclusions.apply(_cases, exclusions.flat_exclusions(exclusions.NODE_EXCLUDE),
                     exclusions.NODE_XFAIL)
del _cls, _name
globals().update(_cases)


def test_exclusion_regexes_match_cases():
    """Every exclusion and xfail names at least one node case (a stale entry
    is an error: the tables are the list of remaining work)."""
    import re

    names = [n for n in dir(_cases["OnnxBackendNodeModelTest"]) if n.startswith("test_")]
    tables = {**exclusions.flat_exclusions(exclusions.NODE_EXCLUDE), **exclusions.NODE_XFAIL}
    stale = [r for r in tables if not any(re.search(r, n) for n in names)]
    assert not stale, stale


# -- the backend's own API --------------------------------------------------------------

def _model(op_type, inputs, **attrs):
    from onnx import helper

    node = helper.make_node(op_type, list(inputs), ["y"], **attrs)
    graph = helper.make_graph(
        [node], "case",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
         for n, a in inputs.items()],
        [helper.make_value_info("y", onnx.TypeProto())])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_run_node_float64_and_0d_inputs():
    """float64 stays float64 (``mx.array`` alone makes it float32) and a
    NumPy scalar stays 0-d."""
    import numpy as np
    from onnx import helper

    x = np.array([[1.5, -2.0]], np.float64)
    (y,) = MlxprogBackend.run_node(helper.make_node("Relu", ["x"], ["y"]), [x])
    assert y.dtype == np.float64 and y.tolist() == [[1.5, 0.0]]
    (y,) = MlxprogBackend.run_node(helper.make_node("Relu", ["x"], ["y"]), [np.float32(-3)])
    assert y.shape == () and y.dtype == np.float32


def test_prepare_dict_inputs_and_device():
    import numpy as np

    x = np.array([1.0, -1.0], np.float32)
    rep = MlxprogBackend.prepare(_model("Relu", {"x": x}))
    assert rep.run({"x": x})[0].tolist() == [1.0, 0.0]
    assert rep.run([x]).out0.tolist() == [1.0, 0.0]
    assert MlxprogBackend.supports_device("CPU") and not MlxprogBackend.supports_device("CUDA")
    with pytest.raises(RuntimeError, match="CPU only"):
        MlxprogBackend.prepare(_model("Relu", {"x": x}), "CUDA")


def test_specialize_inputs_binds_shape_inputs():
    """A shape input given at run time is bound at import, one program per
    distinct value; without ``specialize_inputs`` it is an import error."""
    import numpy as np

    from mlxprog.onnx import OnnxImportError, registry

    x = np.arange(6, dtype=np.float32)
    model = _model("Reshape", {"x": x, "shape": np.array([2, 3], np.int64)})
    if registry.find("Reshape") is None:
        pytest.skip("Reshape has no converter yet")
    with pytest.raises(OnnxImportError, match="must be known at"):
        MlxprogBackend.prepare(model)
    rep = MlxprogBackend.prepare(model, specialize_inputs=True)
    assert rep.run([x, np.array([2, 3], np.int64)])[0].shape == (2, 3)
    assert rep.run([x, np.array([3, 2], np.int64)])[0].shape == (3, 2)
    assert rep.specialized == ["shape"] and len(rep.reps) == 2


def test_the_op_table_in_the_docs_is_current():
    """docs/onnx.md's op table is what ``python tests/onnx/exclusions.py
    --docs`` writes from the converter registry and the tables of
    exclusions.py: rerun it after changing either."""
    from pathlib import Path

    from mlxprog.onnx.docs import op_table, with_table

    path = Path(__file__).parents[2] / "docs" / "onnx.md"
    text = path.read_text()
    outcomes = exclusions.node_outcomes(exclusions.node_cases(), exclusions.NODE_EXCLUDE,
                                        exclusions.NODE_XFAIL)
    assert with_table(text, op_table(outcomes)) == text, (
        "docs/onnx.md's op table is stale: run python tests/onnx/exclusions.py --docs")
