"""Fold the affine tail of a convolution into its weights, and its sum and
ReLU into it, before import.

A ``Conv`` whose output feeds only an inference ``BatchNormalization``, a
``Mul`` by a constant or an ``Add`` of one (broadcast per output channel, or
a single element), and so on down the chain, computes ``conv(x, W) * s + t``
for per-channel ``s`` and ``t``; that is the convolution of ``x`` with
``W * s[c_out]`` plus the bias ``b * s + t``. :func:`fold_conv_affine`
rewrites each such chain into one ``Conv`` with new initializers (the
importer then emits no multiply for it, only the Conv's bias add), as
onnxruntime does when it loads a model; ``import_model(...,
fold_batch_norm=False)`` skips it.

Only values known from the graph itself count as constants: initializers,
and what nodes compute from those alone (``Constant``, ``ConstantOfShape``
...), evaluated as the importer would fold them. The chain's parameters are combined in float64 and
the new weight and bias rounded once, to the weight's dtype. A conv output
with any other reader (another node, a subgraph, a graph output) is left as
it is, and so is a ``BatchNormalization`` in training mode, with its
running-statistics outputs, or with ``spatial=0`` (old opsets: statistics
per element, not per channel).

:func:`fuse_conv_epilogue` then makes each Conv followed by an Add of
another value and/or a Relu one onnxruntime ``FusedConv`` (which the
importer also reads in models that onnxruntime's optimizer wrote), so the
sum and the ReLU run in the convolution's kernel.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import registry
from .graph import free_names

#: Weight dtypes the pass folds (others are imported as they are).
_FOLDED_DTYPES = (np.float16, np.float32, np.float64)


def fold_conv_affine(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each Conv + per-channel affine chain of its main graph
    folded into one Conv (see the module docstring); the model itself when
    nothing folds. The new weight and bias are initializers named
    ``<W>.affine`` and ``<B>.affine`` (``<W>.affine_bias`` for a Conv
    without bias, which a chain of Muls alone leaves without); the folded
    Conv writes the chain's last output, under the Conv's node name. The
    nodes computing constants nobody reads any more, and such initializers,
    are dropped."""
    graph = model.graph
    constants = _Constants(graph)
    nodes = list(graph.node)
    outputs = [out.name for out in graph.output]
    readers = _readers(nodes, outputs)
    consumers: dict[str, list[int]] = {}  # value -> the indices of the nodes reading it
    for index, node in enumerate(nodes):
        for name in set(node.input):
            consumers.setdefault(name, []).append(index)
    taken = {*(i.name for i in graph.initializer), *(out for n in nodes for out in n.output),
             *(i.name for i in graph.input)}
    dropped: set[int] = set()  # the indices of the chain nodes folded away
    new_initializers = []
    for index, node in enumerate(nodes):
        if not _is_conv_with_constant_weights(node, constants):
            continue
        chain, scale, shift = _affine_chain(node, nodes, constants, readers, consumers)
        if not chain:
            continue
        weight = constants.get(node.input[1])
        bias = constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        new_w = (weight.astype(np.float64) * scale.reshape(-1, *[1] * (weight.ndim - 1))).astype(weight.dtype)
        w_name = _fresh(f"{node.input[1]}.affine", taken)
        new_initializers.append(numpy_helper.from_array(new_w, w_name))
        folded = onnx.NodeProto()
        folded.CopyFrom(node)
        del folded.input[:], folded.output[:]
        folded.input.extend([node.input[0], w_name])
        # A bias-free Conv scaled only stays bias-free (no add of zeros).
        if bias is not None or shift.any():
            b_name = _fresh(f"{node.input[2]}.affine" if bias is not None
                            else f"{node.input[1]}.affine_bias", taken)
            b64 = np.zeros(weight.shape[0]) if bias is None else bias.astype(np.float64)
            new_b = (b64 * scale + shift).astype(weight.dtype)
            new_initializers.append(numpy_helper.from_array(new_b, b_name))
            folded.input.append(b_name)
        folded.output.append(nodes[chain[-1]].output[0])
        nodes[index] = folded
        dropped.update(chain)
    if not dropped:
        return model

    live = _live(nodes, dropped, constants.evaluated, outputs)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes[i] for i in live)
    out.graph.initializer.extend(new_initializers)
    if out.ir_version < 4:  # then an initializer must be a graph input too
        out.graph.input.extend(helper.make_tensor_value_info(init.name, init.data_type, init.dims)
                               for init in new_initializers)
    _drop_unread(out.graph)
    return out


class _Constants:
    """The graph's values known from the graph alone, computed on demand:
    initializers, and the outputs of nodes whose inputs are all known (a
    ``Constant``, the light models' ``ConstantOfShape`` weights), evaluated
    by ONNX's reference evaluator as the importer folds them (only ops it
    may fold: :func:`.registry.foldable`)."""

    def __init__(self, graph: onnx.GraphProto):
        self._values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
        self._producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
        self._nodes = list(graph.node)
        self._failed: set[int] = set()
        #: The indices of the nodes evaluated.
        self.evaluated: set[int] = set()

    def get(self, name: str) -> np.ndarray | None:
        """``name``'s value, or None where it is not known from the graph."""
        if name in self._values:
            return self._values[name]
        index = self._producer.get(name)
        if index is None or index in self._failed or not self._evaluate(index):
            return None
        return self._values[name]

    def _evaluate(self, index: int) -> bool:
        from onnx.reference import ReferenceEvaluator  # loaded only when a chain needs it

        node = self._nodes[index]
        inputs = {name: self.get(name) for name in node.input if name}
        if (not registry.foldable(node.op_type, node.domain)
                or any(v is None for v in inputs.values())
                or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                       for a in node.attribute)):
            self._failed.add(index)
            return False
        try:
            outputs = ReferenceEvaluator(node).run(None, inputs)
        except Exception:  # noqa: BLE001 - the importer reports what is wrong with it
            self._failed.add(index)
            return False
        self._values.update((out, np.asarray(v)) for out, v in zip(node.output, outputs) if out)
        self.evaluated.add(index)
        return True


def _readers(nodes: list[onnx.NodeProto], outputs: list[str]) -> Counter:
    """How many times each value name is read: by a node's inputs, by a
    subgraph of a node (once per subgraph that names it), as one of the
    graph's ``outputs``."""
    readers: Counter = Counter()
    for node in nodes:
        readers.update(n for n in node.input if n)
        for a in node.attribute:
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                readers.update(free_names(g))
    readers.update(outputs)
    return readers


def _live(nodes: list[onnx.NodeProto], dropped: set[int], constant: set[int],
          outputs: list[str]) -> list[int]:
    """The indices of ``nodes``, in order, less those ``dropped`` and the
    nodes computing constants (indices ``constant``) whose outputs nobody
    reads any more (a folded Conv's original weight computation)."""
    live = [i for i in range(len(nodes)) if i not in dropped]
    while True:
        readers = _readers([nodes[i] for i in live], outputs)
        dead = {i for i in live if i in constant and not any(readers[o] for o in nodes[i].output)}
        if not dead:
            return live
        live = [i for i in live if i not in dead]


#: The domain of onnxruntime's contrib ops, whose FusedConv is a Conv with
#: its activation.
CONTRIB_DOMAIN = "com.microsoft"


def fuse_conv_epilogue(model: onnx.ModelProto,
                       shapes: Mapping[str, tuple[int | str | None, ...]]) -> onnx.ModelProto:
    """``model`` with each Conv of its main graph whose output only an
    ``Add`` (or two-input ``Sum``) of another value of the same shape (by ONNX's shape inference,
    ``shapes``: every axis known, no broadcasting), or only a ``Relu``, or
    only such an ``Add`` and then only a ``Relu`` read, made one onnxruntime
    ``FusedConv``
    (domain ``com.microsoft``: the Add's other input as its sum input ``Z``,
    ``activation="Relu"`` for the Relu), as onnxruntime's graph optimizer
    fuses them. It writes the chain's last output, under the Conv's node
    name, where the chain's last node was (``Z`` may be computed after the
    Conv). The importer then adds ``Z`` and applies the ReLU inside the
    convolution's kernel (a residual block's shortcut and ReLU) instead of
    in passes of their own over the result. The values are the same. The
    model itself when nothing fuses."""
    graph = model.graph
    nodes = list(graph.node)
    readers = _readers(nodes, [out.name for out in graph.output])
    consumers: dict[str, list[int]] = {}
    for index, node in enumerate(nodes):
        for name in set(node.input):
            consumers.setdefault(name, []).append(index)

    dropped: set[int] = set()  # the chains' nodes, each fused into one FusedConv

    def sole_reader(value: str, *op_types: str) -> int | None:
        """The index of the one node reading ``value``, if it is one of
        ``op_types`` of the default domain not fused already (the Add of two
        Convs' outputs goes to the first)."""
        if readers[value] != 1 or len(consumers.get(value, ())) != 1:
            return None
        index = consumers[value][0]
        node = nodes[index]
        if (node.op_type not in op_types or not _is_default_domain(node)
                or len(node.output) != 1 or index in dropped):
            return None
        return index

    fused: dict[int, onnx.NodeProto] = {}  # position -> the FusedConv written there
    for index, node in enumerate(nodes):
        if node.op_type != "Conv" or not _is_default_domain(node) or len(node.output) != 1:
            continue
        chain, value, inputs = [], node.output[0], list(node.input)
        add = sole_reader(value, "Add", "Sum")  # a Sum of two is an Add (Caffe2's exports)
        other = _other_operand(nodes[add], value, shapes) if add is not None else None
        if other is not None:
            inputs = inputs + [""] * (3 - len(inputs)) + [other]
            chain.append(add)
            value = nodes[add].output[0]
        relu = sole_reader(value, "Relu")
        if relu is not None:
            chain.append(relu)
            value = nodes[relu].output[0]
        if not chain:
            continue
        attributes = [helper.make_attribute("activation", "Relu")] if relu is not None else []
        conv = helper.make_node("FusedConv", inputs, [value], name=node.name,
                                domain=CONTRIB_DOMAIN)
        conv.attribute.extend([*node.attribute, *attributes])
        fused[chain[-1]] = conv
        dropped.update([index, *chain])
    if not fused:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(fused.get(i, node) for i, node in enumerate(nodes)
                          if i in fused or i not in dropped)
    if not any(entry.domain == CONTRIB_DOMAIN for entry in out.opset_import):
        out.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    return out


def _other_operand(add: onnx.NodeProto, value: str,
                   shapes: Mapping[str, tuple[int | str | None, ...]]) -> str | None:
    """The input of ``add`` that is not ``value``, where it has the sum's
    shape in full (so it needs no broadcasting), else None."""
    if len(add.input) != 2 or list(add.input).count(value) != 1:
        return None
    other = add.input[1] if add.input[0] == value else add.input[0]
    shape = shapes.get(other)
    if shape is None or None in shape or shape != shapes.get(add.output[0]):
        return None
    return other


def _is_default_domain(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx")


def _is_conv_with_constant_weights(node: onnx.NodeProto, constants: _Constants) -> bool:
    """Whether ``node`` is a Conv whose weight (and bias, if given) are
    constants of a folded dtype."""
    if node.op_type != "Conv" or not _is_default_domain(node) or len(node.input) < 2:
        return False
    weight = constants.get(node.input[1])
    if weight is None or weight.dtype.type not in _FOLDED_DTYPES or weight.ndim < 3:
        return False
    if len(node.input) > 2 and node.input[2]:
        bias = constants.get(node.input[2])
        return bias is not None and bias.shape == (weight.shape[0],)
    return True


def _affine_chain(conv: onnx.NodeProto, nodes: list[onnx.NodeProto], constants: _Constants,
                  readers: Counter, consumers: dict[str, list[int]]
                  ) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The indices in ``nodes`` of the nodes after ``conv`` that fold into
    it, in order, and the float64 per-output-channel ``scale`` and ``shift``
    they apply together (``y * scale + shift``). Each node's data input must be the previous
    node's output, read by nothing else (``readers``: all reads, subgraphs
    and graph outputs included; ``consumers``: the indices of the nodes
    reading a name)."""
    weight = constants.get(conv.input[1])
    channels, rank = weight.shape[0], weight.ndim
    scale, shift = np.ones(channels), np.zeros(channels)
    chain: list[int] = []
    value = conv.output[0]
    while readers[value] == 1 and len(consumers.get(value, ())) == 1:
        node = nodes[consumers[value][0]]
        step = _affine_step(node, value, channels, rank, constants)
        if step is None:
            break
        s, t = step
        scale, shift = scale * s, shift * s + t
        chain.append(consumers[value][0])
        value = node.output[0]
    return chain, scale, shift


def _affine_step(node: onnx.NodeProto, value: str, channels: int, rank: int,
                 constants: _Constants) -> tuple[np.ndarray, np.ndarray] | None:
    """What ``node``, reading ``value`` (``[N, channels, *spatial]`` of
    ``rank`` dims), does to it as float64 ``(scale, shift)`` per channel,
    or None when it is not a per-channel affine map of constants."""
    if not _is_default_domain(node):
        return None
    if node.op_type == "BatchNormalization":
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.input[0] != value or not _is_inference_batch_norm(node, attrs):
            return None
        params = [constants.get(n) for n in node.input[1:5]]
        if any(p is None or p.dtype.type not in _FOLDED_DTYPES or p.shape != (channels,)
               for p in params):
            return None
        gamma, beta, mean, var = (p.astype(np.float64) for p in params)
        k = gamma / np.sqrt(var + attrs.get("epsilon", 1e-5))
        return k, beta - mean * k
    if node.op_type in ("Mul", "Add") and len(node.input) == 2 and len(node.output) == 1:
        other = node.input[1] if node.input[0] == value else node.input[0]
        if other == value:  # y * y, y + y: not affine
            return None
        per_channel = _per_channel(constants.get(other), channels, rank)
        if per_channel is None:
            return None
        if node.op_type == "Mul":
            return per_channel, np.zeros(channels)
        return np.ones(channels), per_channel
    return None


def _is_inference_batch_norm(node: onnx.NodeProto, attrs: dict) -> bool:
    """Whether a BatchNormalization (its attributes ``attrs``) normalizes per
    channel with given statistics: not ``training_mode=1``, ``is_test=0``
    (opsets before 7) or ``spatial=0`` (opsets 7-8), and no
    running-statistics outputs named."""
    if attrs.get("training_mode", 0) or not attrs.get("is_test", 1) or not attrs.get("spatial", 1):
        return False
    return len(node.input) == 5 and not any(node.output[1:])


def _per_channel(array: np.ndarray | None, channels: int, rank: int) -> np.ndarray | None:
    """A constant that broadcasts against ``[N, channels, *spatial]``
    (``rank`` dims) without growing it, and varies at most along the channel
    axis, as ``[channels]`` float64 values; None for anything else."""
    if array is None or array.dtype.type not in _FOLDED_DTYPES or array.ndim > rank:
        return None
    padded = (1,) * (rank - array.ndim) + array.shape
    if padded[0] != 1 or padded[1] not in (1, channels) or any(s != 1 for s in padded[2:]):
        return None
    return np.broadcast_to(array.astype(np.float64).reshape(-1), (channels,))


def _fresh(name: str, taken: set[str]) -> str:
    """``name``, or ``name.1``, ``name.2`` ... where taken; the answer is taken."""
    candidate, n = name, 0
    while candidate in taken:
        n += 1
        candidate = f"{name}.{n}"
    taken.add(candidate)
    return candidate


def _drop_unread(graph: onnx.GraphProto) -> None:
    """Drop the initializers (and their graph-input entries, ONNX's
    defaults) and the ``value_info`` of values nobody reads or writes any
    more."""
    read = set(_readers(list(graph.node), [out.name for out in graph.output]))
    written = {out for node in graph.node for out in node.output}
    kept = [init for init in graph.initializer if init.name in read]
    gone = {init.name for init in graph.initializer} - {init.name for init in kept}
    del graph.initializer[:]
    graph.initializer.extend(kept)
    inputs = [spec for spec in graph.input if spec.name not in gone]
    del graph.input[:]
    graph.input.extend(inputs)
    infos = [info for info in graph.value_info if info.name in read or info.name in written]
    del graph.value_info[:]
    graph.value_info.extend(infos)
