"""ONNX's model test suites run through mlxprog's ONNX backend
(``onnx.backend.test.BackendTest``): ``real`` (the nine light
architectures the wheel ships with compact weights -- AlexNet,
DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19,
ZFNet-512 -- fed ``arange(n)/n`` and checked against the outputs shipped
beside them), ``simple``, ``pytorch-converted`` and ``pytorch-operator``
(model directories with their test data sets). Each is imported,
validated, round-tripped through the program's JSON, compiled on the CPU
and checked (count, shape, dtype, values at the case's rtol/atol).

The shipped light models' outputs are constants (their compact weights
are ``ConstantOfShape`` fills: softmax of a constant), so
``test_light_model_random_weights_against_onnxruntime`` also runs them with
seeded random weights against onnxruntime, for their numerics (the three
with large fully connected layers only with ``MLXPROG_ONNX_SLOW=1``).

Exclusions and expected failures are ``MODEL_EXCLUDE`` and ``MODEL_XFAIL``
in ``exclusions.py`` (``python tests/onnx/exclusions.py --models``
rewrites them from a run). The light models' runner writes its generated
input files under ``$ONNX_HOME`` (default ``~/.onnx``); here that is a
temporary directory.
"""

import os
import tempfile
import warnings

import onnx.backend.test
import pytest

import exclusions  # noqa: I001
from mlxprog.onnx.backend import MlxprogBackend

os.environ.setdefault("ONNX_HOME", tempfile.mkdtemp(prefix="mlxprog-onnx-home-"))


class ModelBackend(MlxprogBackend):
    """The backend, ignoring the runner's tolerance keywords."""

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        kwargs.pop("rtol", None)
        kwargs.pop("atol", None)
        return MlxprogBackend.prepare(model, device, **kwargs)


with warnings.catch_warnings():  # the node cases' generators divide by zero on purpose
    warnings.simplefilter("ignore")
    backend_test = onnx.backend.test.BackendTest(ModelBackend, __name__)
_cases = {name: cls for name, cls in backend_test.test_cases.items()
          if name != "OnnxBackendNodeModelTest"}
_cls = _name = None
for _cls in _cases.values():
    for _name in [n for n in vars(_cls) if n.endswith("_cuda")]:
        delattr(_cls, _name)
del _cls, _name
if not os.environ.get("MLXPROG_ONNX_MODEL_ALL"):
    # MLXPROG_ONNX_MODEL_ALL=1 runs every case, exclusions included.
    exclusions.apply(_cases, exclusions.MODEL_EXCLUDE, exclusions.MODEL_XFAIL)
globals().update(_cases)


def test_model_exclusion_regexes_match_cases():
    """Every model exclusion and xfail names at least one case."""
    import re

    names = [n for cls in _cases.values() for n in dir(cls) if n.startswith("test_")]
    stale = [r for r in {**exclusions.MODEL_EXCLUDE, **exclusions.MODEL_XFAIL}
             if not any(re.search(r, n) for n in names)]
    assert not stale, stale


# -- the light models with random weights, against onnxruntime ---------------------------

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
#: AlexNet, ZFNet-512 and VGG-19 carry 240-550 MB of fully connected weights
#: (random ones take 10-30 s to make, hand to onnxruntime and run here) and
#: have no op the others lack (Conv, Relu, LRN, MaxPool, Gemm, Dropout,
#: Softmax: Inception v1 has them all); MLXPROG_ONNX_SLOW=1 includes them.
_SLOW_LIGHT = {"bvlc_alexnet", "zfnet512", "vgg19"}


def random_weights(model, seed: int = 0):
    """The light model with each ``ConstantOfShape`` weight (every output of
    it is a constant otherwise: softmax of a constant) replaced by a seeded
    random initializer: weights (rank >= 2) normal with variance 1/fan-in, vectors
    (biases, batch-norm statistics) uniform in [0.5, 1.5]."""
    import numpy as np
    from onnx import numpy_helper

    rng = np.random.default_rng(seed)
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    kept, shapes_used = [], set()
    for node in graph.node:
        shape = inits.get(node.input[0]) if node.op_type == "ConstantOfShape" else None
        if shape is None:
            kept.append(node)
            continue
        shape = tuple(int(d) for d in shape)
        if len(shape) >= 2:
            fan_in = int(np.prod(shape[1:]))
            value = rng.normal(0.0, np.sqrt(1.0 / fan_in), shape)
        else:
            value = rng.uniform(0.5, 1.5, shape)
        graph.initializer.append(numpy_helper.from_array(value.astype(np.float32),
                                                         node.output[0]))
        # These models are IR version 3: an initializer is also a graph input.
        graph.input.append(onnx.helper.make_tensor_value_info(
            node.output[0], onnx.TensorProto.FLOAT, list(shape)))
        shapes_used.add(node.input[0])
    del graph.node[:]
    graph.node.extend(kept)
    still = [i for i in graph.initializer if i.name not in shapes_used
             or any(i.name in n.input for n in kept)]
    del graph.initializer[:]
    graph.initializer.extend(still)
    names = {i.name for i in still}
    inputs = [i for i in graph.input if i.name in names or i.name not in shapes_used]
    del graph.input[:]
    graph.input.extend(inputs)
    return model


@pytest.mark.parametrize("name", sorted(
    os.path.basename(p)[len("light_"):-len(".onnx")]
    for p in __import__("glob").glob(os.path.join(LIGHT, "light_*.onnx"))))
def test_light_model_random_weights_against_onnxruntime(name):
    """The nine architectures' numerics (the shipped outputs are constants):
    with random weights, mlxprog's outputs equal onnxruntime's."""
    import numpy as np

    ort = pytest.importorskip("onnxruntime")
    if name in _SLOW_LIGHT and not os.environ.get("MLXPROG_ONNX_SLOW"):
        pytest.skip(f"{name}: large fully connected weights, slow (MLXPROG_ONNX_SLOW=1 runs it)")
    model = random_weights(onnx.load(os.path.join(LIGHT, f"light_{name}.onnx")))
    inits = {i.name for i in model.graph.initializer}
    spec = next(i for i in model.graph.input if i.name not in inits)
    shape = tuple(d.dim_value for d in spec.type.tensor_type.shape.dim)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    ort.set_default_logger_severity(3)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {spec.name: x})
    got = MlxprogBackend.prepare(model).run([x])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert np.unique(w).size > 1  # not a constant any more
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5 * float(np.abs(w).max()))
