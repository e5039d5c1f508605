"""Generator (b): structural mutations of the programs in ``examples/``.

One to three tree mutations (delete, duplicate or swap entries, change refs,
JSON types, shapes, dtypes, ops and attributes, nest the body in a ``cond``,
make an axis symbolic), then sometimes a text mutation (a duplicate key, a
``NaN`` or overflowing number literal, a truncation, a stray character).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from pathlib import Path
from typing import Any

import mlxprog as mp

from .choice import Chooser
from .document import DTYPES
from .hostile import HUGE_SIZES, hostile
from .registry_gen import Context, op_names, value_of

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
REF_KINDS = ("input", "capture", "const", "result", "carry")
_NUMBER = re.compile(r"(?<=[:\[,\s])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?=[,\]\}\s])")
_KEY = re.compile(r'"(\w+)": ')


@functools.lru_cache(maxsize=1)
def examples() -> tuple[tuple[str, str], ...]:
    """``(name, text)`` of every example program, sorted by name."""
    return tuple((p.stem, p.read_text()) for p in sorted(EXAMPLES.glob("*.json")))


def mutated_example(c: Chooser) -> str:
    """An example program after random mutations, as JSON text."""
    _, text = c.choice(examples())
    data = json.loads(text)
    for _ in range(c.integer(1, 3)):
        data = c.choice(TREE_MUTATIONS)(c, data)
    text = json.dumps(data)
    if c.chance(0.25):
        text = c.choice(TEXT_MUTATIONS)(c, text)
    return text


# -- walking the tree -----------------------------------------------------------

def nodes(data: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    """Every (path, value) below ``data``, itself included."""
    found = [(path, data)]
    if isinstance(data, dict):
        for key, value in data.items():
            found += nodes(value, (*path, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found += nodes(value, (*path, i))
    return found


def get(data: Any, path: tuple) -> Any:
    for key in path:
        data = data[key]
    return data


def put(data: Any, path: tuple, value: Any) -> Any:
    """``data`` with the node at ``path`` replaced (the root when empty)."""
    if not path:
        return value
    get(data, path[:-1])[path[-1]] = value
    return data


def _pick(c: Chooser, data: Any, test) -> tuple | None:
    """A random path whose value passes ``test`` (None if there is none)."""
    candidates = [path for path, value in nodes(data) if test(path, value)]
    return c.choice(candidates) if candidates else None


def _is_ref(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)) in REF_KINDS


def _instructions(data: Any) -> list[tuple]:
    return [p for p, v in nodes(data) if isinstance(v, dict) and "op" in v and p and
            isinstance(p[-1], int)]


# -- tree mutations -------------------------------------------------------------

def _delete(c: Chooser, data: Any) -> Any:
    path = _pick(c, data, lambda p, v: bool(p))
    if path:
        del get(data, path[:-1])[path[-1]]
    return data


def _duplicate(c: Chooser, data: Any) -> Any:
    path = _pick(c, data, lambda p, v: bool(p) and isinstance(p[-1], int))
    if path:
        get(data, path[:-1]).insert(path[-1], copy.deepcopy(get(data, path)))
    return data


def _swap(c: Chooser, data: Any) -> Any:
    path = _pick(c, data, lambda p, v: isinstance(v, list) and len(v) >= 2)
    if path:
        items = get(data, path)
        i, j = c.sample(range(len(items)), 2)
        items[i], items[j] = items[j], items[i]
    return data


def _hostile(c: Chooser, data: Any) -> Any:
    path = _pick(c, data, lambda p, v: bool(p))
    return put(data, path, hostile(c)) if path else data


def _retype(c: Chooser, data: Any) -> Any:
    """The same value in another JSON type (``1`` -> ``"1"``, ``1.0``, ``true``...)."""
    path = _pick(c, data, lambda p, v: bool(p))
    if not path:
        return data
    value = get(data, path)
    if isinstance(value, bool):
        new = c.choice([int(value), str(value).lower(), [value]])
    elif isinstance(value, int):
        new = c.choice([str(value), float(value), value == 1, [value], None])
    elif isinstance(value, float):
        new = c.choice([str(value), int(value) if value == value and abs(value) < 1e18 else 0,
                        [value]])
    elif isinstance(value, str):
        new = c.choice([[value], 0, {value: 0}, value.upper(), value + " "])
    elif isinstance(value, list):
        new = c.choice([{str(i): v for i, v in enumerate(value)}, value[0] if value else 0,
                        [value]])
    else:
        new = c.choice([list(value.values()), [value], json.dumps(value)])
    return put(data, path, new)


def _change_ref(c: Chooser, data: Any) -> Any:
    path = _pick(c, data, lambda p, v: _is_ref(v))
    if not path:
        return data
    (kind, index), = get(data, path).items()
    if c.chance(0.5):
        new = {c.choice(REF_KINDS): index}
    else:
        shift = c.choice([1, -1, 10**6, 2**31, 2**63, "0", None, True, 0.0, [0]])
        new = {kind: index + shift if isinstance(shift, int) and not isinstance(shift, bool)
               and isinstance(index, int) else shift}
    return put(data, path, new)


def _change_shape(c: Chooser, data: Any) -> Any:
    path = _pick(c, data, lambda p, v: bool(p) and p[-1] == "shape" and isinstance(v, list))
    if not path:
        return data
    shape = get(data, path)
    action = c.choice(["entry", "add", "remove"])
    if action == "add" or not shape:
        shape.insert(c.integer(0, len(shape)), c.choice([1, 0, 2, 5]))
    elif action == "remove":
        shape.pop(c.integer(0, len(shape) - 1))
    else:
        shape[c.integer(0, len(shape) - 1)] = c.choice([0, 1, 2, *HUGE_SIZES, -1, "T", "-T", "T//0",
                                                        "T%0", "2*T", "1", 1.5, True, None, "1e30"])
    if any(isinstance(d, str) for d in shape) and isinstance(data, dict) and c.chance(0.7):
        data.setdefault("dims", {"T": {}})
    return data


def _change_dtype(c: Chooser, data: Any) -> Any:
    path = _pick(c, data, lambda p, v: bool(p) and p[-1] == "dtype")
    if path:
        put(data, path, c.weighted(DTYPES) if c.chance(0.9) else c.choice(["float", "", "f4"]))
    return data


def _change_op(c: Chooser, data: Any) -> Any:
    paths = _instructions(data)
    if paths:
        op = c.choice(op_names()) if c.chance(0.9) else c.choice(["bogus", "Add", "add "])
        get(data, c.choice(paths))["op"] = op
    return data


def _change_attr(c: Chooser, data: Any) -> Any:
    """Set one attribute of an instruction to a value drawn from its model."""
    paths = _instructions(data)
    if not paths:
        return data
    instruction = get(data, c.choice(paths))
    try:
        fields = mp.lookup(instruction["op"]).attrs.model_fields
    except Exception:  # an unknown op (or a mutated one): no model to draw from
        return data
    attrs = instruction.setdefault("attrs", {})
    if not fields or not isinstance(attrs, dict):
        return data
    name = c.choice(sorted(fields))
    if name in attrs and c.chance(0.3):
        del attrs[name]
    else:
        info = fields[name]
        attrs[name] = hostile(c) if c.chance(0.3) else value_of(
            c, info.annotation, info.metadata, Context([2, 3], 1, name))
    return data


def _nest(c: Chooser, data: Any) -> Any:
    """Move the body into a ``cond`` on a true constant, once or nested many
    times (the ``else`` branch is the original body at every level)."""
    if not isinstance(data, dict) or not isinstance(data.get("instructions"), list):
        return data
    outputs = data.get("outputs", [])
    if not isinstance(outputs, list):
        return data
    constants = data.setdefault("constants", [])
    if not isinstance(constants, list):
        return data
    constants.append({"value": True, "dtype": "bool"})
    predicate = {"const": len(constants) - 1}
    original = {"instructions": data["instructions"], "outputs": outputs}
    instructions = data["instructions"]
    for _ in range(c.choice([1, 2, 8, 40])):
        branch = {"instructions": instructions, "outputs": outputs}
        instructions = [{"op": "cond", "operands": [predicate],
                         "subprograms": {"then": branch, "else": copy.deepcopy(original)}}]
        outputs = [{"result": i} for i in range(len(outputs))]
    data["instructions"], data["outputs"] = instructions, outputs
    return data


def _symbolic(c: Chooser, data: Any) -> Any:
    """Make one axis of one input the dim ``T``."""
    path = _pick(c, data, lambda p, v: len(p) >= 2 and p[0] == "inputs" and p[-1] == "shape"
                 and isinstance(v, list) and v)
    if not path or not isinstance(data, dict):
        return data
    shape = get(data, path)
    shape[c.integer(0, len(shape) - 1)] = c.choice(["T", "T", "2*T", "T+1"])
    data["dims"] = {"T": c.choice([{}, {"min": 0}, {"min": 1, "max": 4}, {"min": 2}])}
    return data


def _insert_instruction(c: Chooser, data: Any) -> Any:
    """A copy of one instruction at another place (later refs shift)."""
    paths = _instructions(data)
    if paths:
        source = get(data, c.choice(paths))
        target = c.choice(paths)
        get(data, target[:-1]).insert(target[-1], copy.deepcopy(source))
    return data


TREE_MUTATIONS = [_delete, _duplicate, _swap, _hostile, _retype, _change_ref, _change_shape,
                  _change_dtype, _change_op, _change_attr, _nest, _symbolic,
                  _insert_instruction]


# -- text mutations -------------------------------------------------------------

def _duplicate_key(c: Chooser, text: str) -> str:
    """Insert a second value for a key that the object already has."""
    matches = list(_KEY.finditer(text))
    if not matches:
        return text
    match = c.choice(matches)
    key = match.group(1)
    value = '"bogus"' if key == "op" else c.choice(['0', '"x"', "[]", "null", '"float32"'])
    return text[:match.start()] + f'"{key}": {value}, ' + text[match.start():]


def _number_literal(c: Chooser, text: str) -> str:
    """Replace a number by NaN, Infinity, an overflowing or a 5,000-digit one."""
    matches = list(_NUMBER.finditer(text))
    if not matches:
        return text
    match = c.choice(matches)
    literal = c.choice(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e-400",
                        "1" + "0" * 5000, "-0", "0.0", "1E5", "18446744073709551615"])
    return text[:match.start()] + literal + text[match.end():]


def _truncate(c: Chooser, text: str) -> str:
    return text[:c.integer(0, max(len(text) - 1, 0))]


def _stray(c: Chooser, text: str) -> str:
    at = c.integer(0, len(text))
    return text[:at] + c.choice(["{", "}", "[", "]", ",", ":", '"', "\\", "\x00", "\ufeff",
                                 "\ud800", " "]) + text[at:]


TEXT_MUTATIONS = [_duplicate_key, _number_literal, _truncate, _stray]
