"""Counting the MLX nodes of a compiled segment's graph.

Calling an ``mx.compile``d function returns lazy outputs whose graph is the
compiled tape: the primitives left after compile's simplification and
fusion (a fused elementwise chain is one ``Compiled...`` node), each of which
costs MLX's per-node scheduling when it is evaluated. MLX 0.32 exposes that
graph to Python only through ``mx.export_to_dot``, so the count is read from
its DOT text: the primitive nodes between the call's inputs and its outputs.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from typing import Sequence

import mlx.core as mx

# The three kinds of line export_to_dot writes for a primitive: the node,
# an input edge and an output edge (arrays are quoted names, primitives ids).
_PRIMITIVE = re.compile(r'^\{ (\d+) \[label ="([^"]*)", shape=rectangle\]; \}$')
_INPUT_EDGE = re.compile(r'^"([^"]+)" -> (\d+)$')
_OUTPUT_EDGE = re.compile(r'^(\d+) -> "([^"]+)"$')

_IN, _OUT = "mlxprog_in_", "mlxprog_out_"


def count_nodes(outputs: Sequence[mx.array], inputs: Sequence[mx.array]) -> Counter[str]:
    """The primitives that computing ``outputs`` from ``inputs`` evaluates,
    by primitive name (``Reshape``, ``QuantizedMatmul``, ``CompiledAddMultiply``,
    ...): every node reached from the outputs without passing an input. A
    multi-output primitive counts once; evaluated arrays (captures,
    constants) and the inputs' own graphs (lazy results of earlier calls)
    are not counted. Costs one walk of the graph: call it when a segment is
    traced or on demand, never per call."""
    names = {f"{_IN}{i}": a for i, a in enumerate(inputs)}
    input_ids = {id(a) for a in inputs}
    # An output that is an input (a value passed through) computes nothing.
    names.update({f"{_OUT}{i}": a for i, a in enumerate(outputs) if id(a) not in input_ids})
    text = io.StringIO()
    mx.export_to_dot(text, *(names[n] for n in names if n.startswith(_OUT)), **names)
    label: dict[str, str] = {}
    operands: dict[str, list[str]] = {}
    producer: dict[str, str] = {}
    for line in text.getvalue().splitlines():
        if m := _PRIMITIVE.match(line):
            label[m[1]] = m[2]
        elif m := _INPUT_EDGE.match(line):
            operands.setdefault(m[2], []).append(m[1])
        elif m := _OUTPUT_EDGE.match(line):
            producer[m[2]] = m[1]
    seen: set[str] = set()
    todo = [n for n in names if n.startswith(_OUT)]
    while todo:
        array = todo.pop()
        node = producer.get(array)
        if array.startswith(_IN) or node is None or node in seen:
            continue
        seen.add(node)
        todo.extend(operands.get(node, ()))
    return Counter(label[node] for node in seen)
