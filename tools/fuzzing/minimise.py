"""Shrinking a failing program: greedy removal and simplification of JSON
nodes while the outcome keeps its signature (class, stage, exception type).

Big cuts come first (whole entries of the document, then of lists), then
smaller values (integers towards 0 and 1, lists to their first element).
A program whose failure lives in its text (a duplicate key, a ``NaN``
literal) cannot be reparsed without losing it and is returned unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from typing import Any, Callable, Iterator

from .case import Case, Outcome
from .mutate import get, nodes


def minimise(case: Case, outcome: Outcome, run: Callable[[Case], Outcome],
             budget: int = 150, seconds: float = 120.0) -> Case:
    """The smallest variant of ``case`` found that still fails like
    ``outcome``, within ``budget`` runs and ``seconds``."""
    try:
        data = json.loads(case.text)
    except (ValueError, RecursionError):
        return case

    def same(candidate: Any) -> bool:
        try:
            text = json.dumps(candidate, allow_nan=True)
        except (ValueError, RecursionError):
            return False
        return run(dataclasses.replace(case, text=text)).signature == outcome.signature

    if not same(data):
        return case
    deadline = time.monotonic() + seconds
    runs = 1
    improved = True
    while improved and runs < budget and time.monotonic() < deadline:
        improved = False
        for candidate in _smaller(data):
            runs += 1
            if same(candidate):
                data, improved = candidate, True
                break
            if runs >= budget or time.monotonic() >= deadline:
                break
    return dataclasses.replace(case, text=json.dumps(data, allow_nan=True))


def _smaller(data: Any) -> Iterator[Any]:
    """Variants of ``data`` with one node removed or simplified."""
    paths = [path for path, _ in nodes(data)]
    for path in paths:  # removals, outermost first
        if path:
            yield _edited(data, path, None, remove=True)
    for path in paths:
        value = get(data, path)
        if isinstance(value, list) and len(value) > 1:
            yield _edited(data, path, value[: len(value) // 2])
            yield _edited(data, path, value[:1])
        elif type(value) is int:
            for simpler in (0, 1, value // 2):
                if abs(simpler) < abs(value):
                    yield _edited(data, path, simpler)
        elif isinstance(value, str) and len(value) > 16:
            yield _edited(data, path, value[: len(value) // 2])


def _edited(data: Any, path: tuple, value: Any, remove: bool = False) -> Any:
    copied = copy.deepcopy(data)
    parent = get(copied, path[:-1]) if path else None
    if remove:
        del parent[path[-1]]
    elif path:
        parent[path[-1]] = copy.deepcopy(value)
    else:
        copied = copy.deepcopy(value)
    return copied
