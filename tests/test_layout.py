"""The package layout: no module of mlxprog imports, directly or through
others, a module that imports it back (function-level imports and imports
under ``TYPE_CHECKING`` included: a type-only import is a dependency too)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "mlxprog"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The mlxprog modules a file imports anywhere: at module level, in a
    function, under ``TYPE_CHECKING``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return _imported(ast.parse(path.read_text()), name, package, modules)


def _imported(tree: ast.Module, name: str, package: str, modules: set[str]) -> set[str]:
    """The ``modules`` that the code ``tree`` of module ``name`` (in
    ``package``) imports."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in modules else base)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(f) for f in files}
    return {_module_name(f): _imports(f, modules) for f in files}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, result = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return result


def test_no_import_cycles():
    cycles = [set(c) for c in _cycles(_graph())]
    assert cycles == []


def test_type_only_and_function_level_imports_count():
    code = ("from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from .b import B\n"
            "def f():\n    from ..c import d\n")
    modules = {"p.q.a", "p.q.b", "p.c", "p.c.d"}
    assert _imported(ast.parse(code), "p.q.a", "p.q", modules) == {"p.q.b", "p.c.d"}


def test_the_pipeline_is_visible_in_the_tree():
    top = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert {"format", "validate", "symbolic", "runtime", "ops", "llm", "native"} <= top


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
