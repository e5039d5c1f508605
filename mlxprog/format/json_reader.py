"""The strict JSON reader of program documents.

A document is standard JSON (RFC 8259) held to a few more rules, so that no
text can mean two things or exhaust the process (see "Strict JSON and
document limits" in ``docs/format.md``):

- no object has a key twice (JSON leaves it to the reader; Python's ``json``
  keeps the last one silently);
- no ``NaN``, ``Infinity`` or ``-Infinity`` literals (the format spells
  non-finite floats as the strings ``"nan"``, ``"inf"``, ``"-inf"``), and no
  number literal beyond the float64 range (``1e400`` would read as infinity);
- integer literals within Python's limit on integer digits (4,300 by default);
- arrays and objects nested at most :data:`MAX_NESTING` deep.

:func:`read_json` parses text under these rules; :func:`check_data` applies
those that can still be seen to data parsed elsewhere. Both raise
:class:`~mlxprog.errors.FormatError`.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import numpy as np

from ..errors import FormatError

MAX_NESTING = 256
"""The deepest nesting of arrays and objects in a document (the document
object is level 1). It leaves room for every limit of
:class:`~mlxprog.limits.Limits` (a subprogram level is 4 levels of JSON)
while keeping every recursive step of loading far from Python's recursion
limit."""

_NESTING_ERROR = f"arrays and objects are nested more than {MAX_NESTING} levels deep"


class _Reject(Exception):
    """Raised inside the parser's hooks; its message becomes the FormatError."""


def read_json(text: str | bytes) -> Any:
    """Parse a document's JSON text (UTF-8 when bytes) under the rules of the
    module docstring; :class:`FormatError` says which was broken."""
    if isinstance(text, (bytes, bytearray)):
        raw = bytes(text)
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise FormatError(f"not valid JSON: {exc}") from None
    elif isinstance(text, str):
        raw = text.encode("utf-8", "surrogatepass")
    else:
        raise TypeError(f"JSON text is str or bytes, not {type(text).__name__}")
    # Every dict built is counted (a hook per object that only counts is
    # cheap; one that sees each object's key list is not): fewer keys than
    # the text has means a key was repeated, found by the slow path below.
    sizes: list[int] = []
    data = _parse(text, _counting(sizes))
    depth, keys = _structure(raw)
    if depth > MAX_NESTING:
        raise FormatError(_NESTING_ERROR)
    if keys != sum(sizes):
        _parse(text, None)  # raises, naming the repeated key
        raise FormatError("an object has a key twice")  # should _parse not find it
    return data


def _parse(text: str, object_hook) -> Any:
    """``json.loads`` with the hooks that reject what the format forbids;
    without ``object_hook``, each object's key list is checked for repeats."""
    hooks = {"object_hook": object_hook} if object_hook else {"object_pairs_hook": _object}
    try:
        return json.loads(text, parse_constant=_constant, parse_float=_float, **hooks)
    except _Reject as exc:
        raise FormatError(str(exc)) from None
    except RecursionError:
        raise FormatError(_NESTING_ERROR) from None
    except json.JSONDecodeError as exc:
        raise FormatError(f"not valid JSON: {exc}") from None
    except ValueError:  # int() refuses the literal (sys.get_int_max_str_digits)
        raise FormatError("not valid JSON: an integer literal has more than "
                          f"{sys.get_int_max_str_digits()} digits") from None


def _counting(sizes: list[int]):
    """An ``object_hook`` appending each object's number of keys to ``sizes``."""
    append = sizes.append

    def hook(obj: dict) -> dict:
        append(len(obj))
        return obj

    return hook


def check_data(data: Any) -> None:
    """The rules that parsed data still shows: nesting depth, and no
    non-finite floats (duplicate keys and literal spellings are gone once
    parsed). Dicts, lists and tuples count as nesting."""
    # Level by level: no recursion, and each level is one flat loop.
    level = [data] if isinstance(data, _CONTAINERS) else []
    depth = 0
    while level:
        depth += 1
        if depth > MAX_NESTING:
            raise FormatError(_NESTING_ERROR)
        below = []
        for container in level:
            for item in container.values() if isinstance(container, dict) else container:
                if isinstance(item, _CONTAINERS):
                    below.append(item)
                elif isinstance(item, float) and not math.isfinite(item):
                    raise FormatError(f"found the float {item}; the format spells non-finite "
                                      'floats as the strings "nan", "inf" and "-inf"')
        level = below


_CONTAINERS = (dict, list, tuple)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        keys = ", ".join(repr(k) for k, _ in pairs[:8]) + (", ..." if len(pairs) > 8 else "")
        raise _Reject(f"duplicate key {key!r} in an object (its keys: {keys})")
    return obj


def _constant(name: str) -> float:
    raise _Reject(f"the JSON literal {name} is not allowed; the format spells non-finite "
                  'floats as the strings "nan", "inf" and "-inf"')


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Reject(f"the number {text} is beyond the float64 range")
    return value


# Everything but the characters that delimit strings, arrays, objects and keys.
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'"[]{}:')

_STEP = np.zeros(256, np.int8)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1


def _structure(raw: bytes) -> tuple[int, int]:
    """The deepest nesting of arrays and objects in valid JSON text, and the
    number of object keys it holds (its colons outside strings). UTF-8: the
    structural bytes are ASCII and never part of a multi-byte character.

    Escapes go first (``\\\\`` then ``\\"``, as JSON pairs them left to
    right), then everything but quotes, brackets and colons, then empty
    strings: dropping two adjacent quotes leaves the in-string parity of
    every other character alone. What remains is almost always brackets and
    colons only; otherwise those inside strings are masked.
    """
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = raw.translate(None, _NOT_STRUCTURE).replace(b'""', b"")
    codes = np.frombuffer(kept, np.uint8)
    steps = _STEP[codes]
    colons = codes == ord(":")
    if b'"' in kept:
        inside = np.cumsum(codes == ord('"'), dtype=np.int32) % 2 == 1
        steps[inside] = 0
        colons &= ~inside
    depth = int(np.cumsum(steps, dtype=np.int32).max(initial=0))
    return depth, int(np.count_nonzero(colons))
