"""Questions about an ONNX graph's value names, shared by the importer and
the folding pass (:mod:`.fold`)."""

from __future__ import annotations

import onnx


def free_names(graph: onnx.GraphProto) -> set[str]:
    """The value names ``graph``'s nodes (and the graphs nested in them) read,
    and its outputs name, that the graph does not define: the enclosing
    graphs' values."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(n for n in node.input if n and n not in defined)
        for a in node.attribute:
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                used.update(n for n in free_names(g) if n not in defined)
        defined.update(node.output)
    # A graph may return an enclosing graph's value as it is.
    used.update(out.name for out in graph.output if out.name not in defined)
    return used
