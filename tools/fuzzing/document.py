"""A small builder of program documents as plain JSON data (dicts and
lists), for generators that must also be able to write what no builder
would accept."""

from __future__ import annotations

from typing import Any

from .choice import Chooser

HEADER = {"format": "mlxprog", "version": 1}

DTYPES = [(12, "float32"), (4, "int32"), (2, "bool"), (2, "float16"), (2, "bfloat16"),
          (2, "float64"), (1, "uint8"), (1, "uint16"), (1, "uint32"), (1, "uint64"),
          (1, "int8"), (1, "int16"), (1, "int64"), (1, "complex64")]
"""Dtypes with weights: mostly float32, every one sometimes."""

SHAPES = [[2, 3], [3], [], [3, 3], [1, 3], [2, 1, 3], [4, 4], [2, 3, 4], [0, 3], [3, 1],
          [1, 1], [2, 2, 2, 2], [0], [1], [1, 2, 3, 4], [5, 2], [3, 0, 2]]
"""Operand shapes, small and plain first; zero-size and size-1 axes included."""

UNARY = ["exp", "negate", "abs", "tanh", "sqrt", "square", "sign", "floor", "logical_not",
         "sigmoid", "log", "reciprocal", "bitwise_not", "round", "real", "imag"]
"""Elementwise ops of one operand (the result keeps the shape)."""

INTEGER_DTYPES = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64", "complex64")


class Document:
    """A program under construction: ``input``/``constant`` return refs,
    ``add`` appends an instruction and returns its first result's ref."""

    def __init__(self, name: str = ""):
        self.data: dict[str, Any] = {**HEADER, "name": name, "inputs": [], "constants": [],
                                     "instructions": [], "outputs": []}
        self.results = 0

    def input(self, shape: list, dtype: str, value_of: str | None = None) -> dict:
        inputs = self.data["inputs"]
        inputs.append({"name": f"x{len(inputs)}", "shape": shape, "dtype": dtype})
        if value_of:
            inputs[-1]["value_of"] = value_of
        return {"input": len(inputs) - 1}

    def constant(self, value: Any, dtype: str) -> dict:
        self.data["constants"].append({"value": value, "dtype": dtype})
        return {"const": len(self.data["constants"]) - 1}

    def add(self, op: str, operands: list, attrs: dict | None = None, n_results: int = 1,
            subprograms: dict | None = None) -> dict:
        instruction: dict[str, Any] = {"op": op, "operands": operands}
        if attrs:
            instruction["attrs"] = attrs
        if subprograms:
            instruction["subprograms"] = subprograms
        self.data["instructions"].append(instruction)
        first = self.results
        self.results += n_results
        return {"result": first}

    def output(self, *refs: dict) -> Document:
        self.data["outputs"].extend(refs)
        return self


def scalar_value(c: Chooser, dtype: str) -> Any:
    """A small literal of a dtype (sometimes a non-finite float)."""
    if dtype == "bool":
        return c.choice([True, False])
    if dtype in INTEGER_DTYPES:
        return c.choice([1, 0, 2, 3, 7] if dtype.startswith("u") else [1, 0, -1, 2, 3, -5])
    return c.choice([0.5, 1.0, 0.0, -2.0, 3.25, "nan", "inf", "-inf", 1e-3])


def array_value(c: Chooser, shape: list[int], dtype: str) -> Any:
    """A nested list literal of a (small) shape."""
    if not shape:
        return scalar_value(c, dtype)
    return [array_value(c, shape[1:], dtype) for _ in range(shape[0])]


def elements(shape: list) -> int:
    total = 1
    for d in shape:
        total *= d if isinstance(d, int) else 1
    return total


def is_axis_name(name: str) -> bool:
    """An attribute that holds axes (validation may normalise negative ones)."""
    return name in ("axis", "axes") or name.endswith(("_axis", "_axes"))
