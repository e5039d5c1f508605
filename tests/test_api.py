"""The public API: what ``mlxprog`` and ``mlxprog.llm`` export, the names
that moved out of them (still importable from the old place, with a
DeprecationWarning), and docs/api.md, which lists both."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import mlxprog
import mlxprog.llm

API_MD = Path(__file__).parents[1] / "docs" / "api.md"
PACKAGES = {"mlxprog": mlxprog, "mlxprog.llm": mlxprog.llm}


def documented(package: str) -> set[str]:
    """The names in the first column of the tables under ``## `package```."""
    sections = re.split(r"^## ", API_MD.read_text(), flags=re.M)
    (section,) = [s for s in sections if s.startswith(f"`{package}`\n")]
    return set(re.findall(r"^\| `(\w+)` \|", section, re.M))


def moved_in_docs() -> dict[str, str]:
    """The rows of the moved-names table: old name -> the module to import from."""
    rows = re.findall(r"^\| `(mlxprog[\w.]*)\.(\w+)` \| `([\w.]+)` \|$", API_MD.read_text(), re.M)
    return {f"{package}.{name}": module for package, name, module in rows}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_exists_once(package):
    exported = PACKAGES[package].__all__
    assert len(exported) == len(set(exported))
    for name in exported:
        assert hasattr(PACKAGES[package], name), name


@pytest.mark.parametrize("package", PACKAGES)
def test_api_md_lists_exactly_the_exported_names(package):
    assert documented(package) == set(PACKAGES[package].__all__)


def test_api_md_lists_exactly_the_moved_names():
    assert moved_in_docs() == {f"{package}.{name}": module
                               for package, module_object in PACKAGES.items()
                               for name, module in module_object.MOVED.items()}


@pytest.mark.parametrize("package, name", [(p, n) for p, m in PACKAGES.items() for n in m.MOVED])
def test_a_moved_name_imports_from_the_old_place_with_a_warning(package, name):
    module = PACKAGES[package].MOVED[name]
    assert name not in PACKAGES[package].__all__
    with pytest.warns(DeprecationWarning, match=rf"{re.escape(package)}\.{name} is deprecated: "
                      rf"import it from {re.escape(module)}$"):
        moved = getattr(PACKAGES[package], name)
    assert moved is getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("package", PACKAGES)
def test_an_unknown_name_is_an_attribute_error(package):
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        getattr(PACKAGES[package], "no_such_name")


def test_from_import_of_a_moved_name_warns():
    with pytest.warns(DeprecationWarning, match="mlxprog.llm.Engine is deprecated"):
        from mlxprog.llm import Engine
    from mlxprog.llm.engine import Engine as moved
    assert Engine is moved
