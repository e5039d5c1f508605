"""Integer extremes in attributes: every integer an op's attributes hold
(a split index, a slice start, a pad width, a window stride, a ``k``...) may
reach MLX's C++ shape code, which stores sizes as 32-bit integers and can
abort the process on a value it cannot convert. This module finds the
integer leaves of an instruction's attributes and puts an extreme value in
one of them; the ``integer_attributes`` attack (:mod:`.attacks`) and
``tools/audit_int_attrs.py`` (every leaf of every op, in turn) use it.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import mlxprog as mp

from .choice import Chooser

EXTREME_INTS = [-(2**63), 2**63 - 1, -1, 2**31, 2**32, 2**31 - 1, -(2**31), -(2**31) - 1,
                2**63, -(2**63) - 1]
"""The values tried: int64's and int32's limits and one past them, -1."""

Path = tuple  # keys and list indices from the attrs object to a leaf


def int_paths(value: Any, path: Path = ()) -> list[Path]:
    """The paths of the integer leaves (not booleans) in an attrs value."""
    if type(value) is int:
        return [path]
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in int_paths(item, (*path, key))]
    if isinstance(value, list):
        return [p for k, item in enumerate(value) for p in int_paths(item, (*path, k))]
    return []


def with_value(attrs: Any, path: Path, value: Any) -> Any:
    """A copy of ``attrs`` with the leaf at ``path`` replaced by ``value``."""
    attrs = copy.deepcopy(attrs)
    node = attrs
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return attrs


@functools.lru_cache(maxsize=None)
def int_attr_ops() -> tuple[str, ...]:
    """The ops (not host ops) whose attribute models hold an integer somewhere."""
    return tuple(sorted(
        name for name, spec in mp.all_ops().items()
        if spec.host is None and '"integer"' in json.dumps(spec.attrs.model_json_schema())))


def extreme_attrs(c: Chooser, program: dict) -> dict | None:
    """``program`` with one integer leaf of its first instruction's attrs set
    to an extreme value (None when the attrs hold no integer)."""
    first = program["instructions"][0]
    paths = [p for p in int_paths(first.get("attrs")) if p]  # () : attrs is not an object
    if not paths:
        return None
    program = copy.deepcopy(program)
    target = program["instructions"][0]
    target["attrs"] = with_value(target["attrs"], c.choice(paths), c.choice(EXTREME_INTS))
    return program
