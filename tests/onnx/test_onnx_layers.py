"""The ONNX importer's modules are layered: none imports, directly or
through others, a module that imports it back. Every import counts: those
inside functions and those under ``TYPE_CHECKING`` too.

``python tests/onnx/test_onnx_layers.py`` prints the cycles (and each
module's imports inside the package with ``-v``)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).parents[2] / "mlxprog" / "onnx"


def module_name(path: Path) -> str:
    """The dotted name of a module file of the package (``mlxprog.onnx.scope``)."""
    parts = path.relative_to(PACKAGE.parents[1]).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that the file ``path`` imports, anywhere in it."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from . import registry`` imports a module; ``from .scope import Scope`` a name.
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                         for alias in node.names)
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports."""
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports(f, modules) for f in files}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through
    others (the strongly connected components of more than one module, or
    a module importing itself), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_importer_has_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_cycle():
    """A cycle through a type-only import is found (the check can fail)."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_graph_sees_type_only_and_relative_imports():
    graph = import_graph()
    # registry.py imports the Context type only under TYPE_CHECKING.
    assert "mlxprog.onnx.context" in graph["mlxprog.onnx.registry"]
    # ``from .. import shape_rules`` in a converter module.
    assert "mlxprog.onnx.shape_rules" in graph["mlxprog.onnx.convert.shape"]


if __name__ == "__main__":
    graph = import_graph()
    if "-v" in sys.argv:
        for module, imported in sorted(graph.items()):
            print(module, "->", ", ".join(sorted(imported)) or "-")
    found = cycles(graph)
    for cycle in found:
        print("cycle:", " <-> ".join(cycle))
    print(f"{len(found)} cycles among {len(graph)} modules")
    sys.exit(1 if found else 0)
