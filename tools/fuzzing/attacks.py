"""Generator (c): targeted attacks, each a family of programs aimed at one
way a program can hurt the process: zero-size arrays, size-1 axes in
symbolic programs, deep nesting, huge result sizes and intermediates,
special values in linear algebra, hostile dim expressions, integer limits,
integer extremes in any op's integer attributes, wrong JSON types, non-contiguous views, very many instructions.

An attack returns the program as JSON data, or as text where the text itself
is the attack (nesting deeper than ``json.dumps`` goes), or a ``(text,
options)`` pair when the case needs particular call options.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from .choice import Chooser
from .document import UNARY, Document
from .extremes import extreme_attrs, int_attr_ops
from .registry_gen import registry_program
from .hostile import HUGE_SIZES, HOSTILE_INTS, hostile

Attack = Any  # dict (a program) | str (a program text) | tuple[str | dict, dict]

# op -> (operand shapes, operand dtypes (None: float), attrs) for zero-size operands.
_ZERO_SIZE = {
    "sum": ([[0, 3]], None, {"axes": [0]}),
    "mean": ([[2, 0]], None, {"axes": [1]}),
    "var": ([[0, 3]], None, {"axes": [0], "ddof": 1}),
    "std": ([[2, 0]], None, {}),
    "reduce_max": ([[0, 3]], None, {"axes": [0]}),
    "reduce_min": ([[0]], None, {}),
    "product": ([[0, 2]], None, {"axes": [0]}),
    "any": ([[0, 2]], ["bool"], {"axes": [0]}),
    "all": ([[2, 0]], ["bool"], {}),
    "argmax": ([[0, 3]], None, {"axis": 0}),
    "argmin": ([[2, 0]], None, {"axis": 1}),
    "softmax": ([[2, 0]], None, {"axes": [1]}),
    "logsumexp": ([[0]], None, {}),
    "sort": ([[0]], None, {"axis": 0}),
    "argsort": ([[3, 0]], None, {"axis": 1}),
    "argpartition": ([[0]], None, {"kth": 0, "axis": 0}),
    "top_k": ([[0]], None, {"k": 1}),
    "cumulative_sum": ([[0, 2]], None, {"axis": 0}),
    "lu": ([[0, 0]], None, {}),
    "inv": ([[0, 0]], None, {}),
    "solve": ([[0, 0], [0]], None, {}),
    "solve_triangular": ([[0, 0], [0, 0]], None, {"upper": False}),
    "cholesky": ([[0, 0]], None, {}),
    "qr": ([[0, 0]], None, {}),
    "svd": ([[0, 0]], None, {}),
    "pinv": ([[0, 3]], None, {}),
    "eigh": ([[0, 0]], None, {}),
    "norm": ([[0, 0]], None, {}),
    "fft": ([[0]], ["complex64"], {}),
    "rfft": ([[0]], None, {}),
    "take": ([[0], [2]], [None, "int32"], {"axis": 0}),
    "take_along_axis": ([[0], [0]], [None, "int32"], {"axis": 0}),
    "gather": ([[0, 3], [2, 1]], [None, "int32"], {"axes": [0], "slice_sizes": [0, 3]}),
    "conv_general": ([[1, 5, 5, 2], [3, 0, 3, 2]], None, {}),
    "conv_transpose": ([[1, 5, 2], [3, 0, 2]], None, {}),
    "matmul": ([[2, 0], [0, 3]], None, {}),
    "split": ([[0]], None, {"indices_or_sections": 3}),
    "window_max": ([[0]], None, {"window_dimensions": [1]}),
    "window_sum": ([[2, 0]], None, {"window_dimensions": [1, 1]}),
    "concatenate": ([[0, 2], [0, 2]], None, {"axis": 0}),
    "pad": ([[0], []], None, {"pad_width": [[1, 1]]}),
    "quantize": ([[0, 64]], None, {}),
    "fast_rms_norm": ([[2, 0], [0]], None, {"eps": 1e-5}),
    "fast_layer_norm": ([[0, 4], [4]], None, {"eps": 1e-5}),
    "sample_greedy": ([[0]], None, {}),
    "random_categorical": ([[2], [2, 0]], ["uint32", None], {"axis": -1}),
    "reshape": ([[0, 3]], None, {"shape": [-1, 0]}),
    "flatten": ([[2, 0, 3]], None, {}),
    "broadcast_to": ([[0, 1]], None, {"shape": [0, 5]}),
}

# Ops over a fixed size-1 axis, with the attributes that reduce over it.
_SIZE_ONE = {
    "sum": {"axes": [0]}, "mean": {"axes": [0]}, "var": {"axes": [0]}, "std": {"axes": [0]},
    "reduce_max": {"axes": [0]}, "reduce_min": {"axes": [0]}, "product": {"axes": [0]},
    "any": {"axes": [0]}, "all": {"axes": [0]}, "softmax": {"axes": [0]},
    "logsumexp": {"axes": [0]}, "argmax": {"axis": 0}, "argmin": {"axis": 0},
    "cumulative_sum": {"axis": 0}, "cumulative_max": {"axis": 0}, "sort": {"axis": 0},
    "argsort": {"axis": 0}, "squeeze": {"axes": [0]}, "transpose": {},
    "expand_dims": {"axes": [0]}, "flatten": {}, "reverse": {"axes": [0]},
    "norm": {"axis": [0]}, "cumulative_product": {"axis": 0}, "logsumexp ": {},
}

# op -> (operand shapes, attrs with one HUGE placeholder) for huge results.
_HUGE = {
    "full": ([], {"shape": ["N"], "dtype": "float32", "value": 1.0}),
    "full ": ([], {"shape": [100000, "N"], "dtype": "float32", "value": 1.0}),
    "iota": ([], {"shape": ["N"], "dtype": "int32"}),
    "eye": ([], {"n": "N", "dtype": "float32"}),
    "arange": ([], {"start": 0, "stop": "N", "step": 1}),
    "random_uniform": ([[2]], {"shape": ["N"], "dtype": "float32"}),
    "random_normal": ([[2]], {"shape": ["N", 2], "dtype": "float32"}),
    "random_bernoulli": ([[2]], {"p": 0.5, "shape": ["N"]}),
    "random_categorical": ([[2], [4]], {"num_samples": "N"}),
    "random_split": ([[2]], {"num": "N"}),
    "pad": ([[2], []], {"pad_width": [[0, "N"]]}),
    "broadcast_to": ([[1]], {"shape": ["N"]}),
    "reshape": ([[2]], {"shape": ["N", 2]}),
    "broadcast": ([[1]], {"shape": ["N"], "axes": [0]}),
    "split": ([[0]], {"indices_or_sections": "N"}),
    "conv_general": ([[1, 4, 1], [1, 1, 1]], {"input_dilation": ["N"]}),
    "conv_general ": ([[1, 4, 1], [1, 1, 1]], {"padding": [["N", "N"]]}),
    "rfftn": ([[4]], {"s": ["N"]}),
    "fft": ([[4]], {"n": "N"}),
    "window_sum": ([[4]], {"window_dimensions": [1], "padding": [[0, "N"]]}),
    "window_max": ([[4]], {"window_dimensions": ["N"]}),
    "slice": ([[4]], {"lengths": ["N"]}),
    "expand_dims": ([[2]], {"axes": ["N"]}),
    "top_k": ([[4]], {"k": "N"}),
    "conv_transpose": ([[1, 4, 1], [1, 1, 1]], {"stride": ["N"]}),
}

_SPECIAL_MATRICES = [
    [["inf", 1, 1], [1, 1, 1], [1, 1, 1]],
    [["nan", 1], [1, 1]],
    [[0, 0], [0, 0]],
    [[1, 2], [2, 4]],
    [[1e30, 1], [1, 1e-30]],
    [["-inf", "inf"], ["inf", "-inf"]],
    [[1]],
]
_LINALG = ["svd", "pinv", "eigh", "inv", "solve", "solve_triangular", "cholesky", "qr", "lu",
           "norm"]

_DIM_EXPRESSIONS = ["T//0", "T%0", "-T", "T-5", "0*T", "T*T*T*T*T*T*T*T", "T//2",
                    "99999999999999999999*T", "T+" * 1000 + "T", "(" * 500 + "T" + ")" * 500,
                    "T**2", "T/2", "T.real", "__import__('os')", "t", "T T", "", "1e3*T"]


def _doc_for(op: str, shapes: list, dtypes: list | None, attrs: dict, dtype: str) -> Document:
    doc = Document(f"attack_{op}")
    refs = [doc.input(shape, (dtypes[k] if dtypes and dtypes[k] else dtype))
            for k, shape in enumerate(shapes)]
    doc.output(doc.add(op.strip(), refs, attrs))
    return doc


def zero_size(c: Chooser) -> Attack:
    """An op on operands with an axis of size 0."""
    op = c.choice(sorted(_ZERO_SIZE))
    shapes, dtypes, attrs = _ZERO_SIZE[op]
    return _doc_for(op, shapes, dtypes, attrs, c.choice(["float32", "float64", "float16"])).data


def symbolic_size_one(c: Chooser) -> Attack:
    """An op over a fixed size-1 axis of an input whose other axis is a dim."""
    op = c.choice(sorted(_SIZE_ONE))
    shape = c.choice([[1, "T"], [1, 1, "T"], [1, "T", 1]])
    dtype = "bool" if op.strip() in ("any", "all") else c.choice(["float32", "int32", "float16"])
    doc = _doc_for(op, [shape], None, _SIZE_ONE[op], dtype)
    doc.data["dims"] = {"T": c.choice([{}, {"min": 1, "max": 8}, {"min": 2}])}
    return doc.data, {"calls": 2}


def deep_nesting(c: Chooser) -> Attack:
    """Subprograms or JSON values nested deeper than anything sensible."""
    depth = c.choice([8, 31, 32, 33, 64, 180, 250, 1000, 5000])
    kind = c.choice(["cond", "while", "constant", "attrs", "garbage"])
    head = '{"format": "mlxprog", "version": 1, '
    if kind == "cond":
        empty = '{"instructions": [], "outputs": [{"carry": 0}]}'
        inner = empty
        for _ in range(depth):
            inner = ('{"instructions": [{"op": "cond", "operands": [{"const": 0}, {"carry": 0}], '
                     f'"subprograms": {{"then": {inner}, "else": {empty}}}}}], '
                     '"outputs": [{"result": 0}]}')
        return (head + '"inputs": [{"name": "x", "shape": [2], "dtype": "float32"}], '
                '"constants": [{"value": true, "dtype": "bool"}], '
                '"instructions": [{"op": "cond", "operands": [{"const": 0}, {"input": 0}], '
                f'"subprograms": {{"then": {inner}, "else": {empty}}}}}], '
                '"outputs": [{"result": 0}]}')
    if kind == "while":
        body = '{"instructions": [], "outputs": [{"carry": 0}]}'
        cond = '{"instructions": [{"op": "less", "operands": [{"carry": 0}, {"const": 0}]}], ' \
               '"outputs": [{"result": 0}]}'
        for _ in range(depth):
            body = ('{"instructions": [{"op": "while", "operands": [{"carry": 0}], '
                    f'"subprograms": {{"cond": {cond}, "body": {body}}}}}], '
                    '"outputs": [{"result": 0}]}')
        return (head + '"inputs": [{"name": "n", "shape": [], "dtype": "int32"}], '
                '"constants": [{"value": 0, "dtype": "int32"}], '
                f'"instructions": [{{"op": "while", "operands": [{{"input": 0}}], '
                f'"subprograms": {{"cond": {cond}, "body": {body}}}}}], '
                '"outputs": [{"result": 0}]}')
    if kind == "constant":
        return (head + '"constants": [{"value": ' + "[" * depth + "1" + "]" * depth +
                ', "dtype": "float32"}], "outputs": [{"const": 0}]}')
    if kind == "attrs":
        return (head + '"inputs": [{"name": "x", "shape": [2], "dtype": "float32"}], '
                '"instructions": [{"op": "sum", "operands": [{"input": 0}], "attrs": {"axes": '
                + "[" * depth + "0" + "]" * depth + '}}], "outputs": [{"result": 0}]}')
    return head + '"name": ' + "[" * depth + "]" * (depth if c.chance(0.5) else 0) + "}"


def huge_result(c: Chooser) -> Attack:
    """An attribute that sets a result's size or count to something enormous."""
    op = c.choice(sorted(_HUGE))
    shapes, attrs = _HUGE[op]
    size = c.choice(HUGE_SIZES)
    attrs = _fill(copy.deepcopy(attrs), size)
    dtypes = ["uint32" if op.startswith("random") and k == 0 else None
              for k in range(len(shapes))]
    return _doc_for(op, shapes, dtypes, attrs, "float32").data


def _fill(value: Any, size: int) -> Any:
    if value == "N":
        return size
    if isinstance(value, list):
        return [_fill(v, size) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, size) for k, v in value.items()}
    return value


def huge_input(c: Chooser) -> Attack:
    """Declared shapes out of range (an input, a capture or a callback output)."""
    size = c.choice([*HUGE_SIZES, 1e30, "1", -1, 2**64])
    doc = Document("attack_huge_input")
    where = c.choice(["input", "capture", "runtime_call"])
    if where == "input":
        doc.output(doc.add(c.choice(UNARY), [doc.input([size, c.choice([1, size])], "float32")]))
    elif where == "capture":
        doc.data["captures"] = [{"name": "w", "shape": [size], "dtype": "float32"}]
        doc.output(doc.add("exp", [{"capture": 0}]))
    else:
        doc.output(doc.add("runtime_call", [], {"callback": "cb",
                                                "outputs": [{"shape": [size], "dtype": "int8"}]}))
    return doc.data


def huge_intermediate(c: Chooser) -> Attack:
    """Contractions whose implementation might build an operand-sized cube."""
    op = c.choice(["matmul", "dot", "einsum", "tensordot"])
    dtype = c.choice(["int32", "int64", "uint8", "float32"])
    # 1024 cubed 4-byte elements exceed a 4 GiB limit. The product itself is
    # 10^9 multiply-adds, seconds for exact integers on a small machine: it is
    # computed once, with time to spare (8-byte integers stay below the cube).
    n = c.weighted([(6, 64), (3, 300), (1, 1024 if dtype != "int64" else 512)])
    attrs = {"dot": {"lhs_contracting_axes": [1], "rhs_contracting_axes": [0]},
             "einsum": {"subscripts": "ij,jk->ik"}, "tensordot": {"axes": 1}}.get(op, {})
    big = n >= 512
    options = {"calls": 1, "eager": not big, "bad_calls": not big, "timeout": 60 if big else None}
    return _doc_for(op, [[n, n], [n, n]], None, attrs, dtype).data, options


def linalg_special(c: Chooser) -> Attack:
    """Linear algebra on matrices with infinities, NaN, zeros, singular ones."""
    op = c.choice(_LINALG)
    matrix = c.choice(_SPECIAL_MATRICES)
    dtype = c.choice(["float32", "float64"])
    doc = Document(f"attack_{op}")
    a = doc.constant(matrix, dtype)
    operands = [a]
    if op in ("solve", "solve_triangular"):
        rhs = [[1] * len(matrix)] * len(matrix) if op == "solve_triangular" else [1] * len(matrix)
        operands.append(doc.constant(rhs, dtype))
    n_out = {"svd": 3, "eigh": 2, "qr": 2, "lu": 3}.get(op, 1)
    first = doc.add(op, operands, {}, n_out)
    doc.output(*[{"result": first["result"] + k} for k in range(n_out)])
    return doc.data, {"calls": 5}


def dim_expression(c: Chooser) -> Attack:
    """A hostile expression in an input shape or a shape attribute."""
    expression = c.choice(_DIM_EXPRESSIONS)
    doc = Document("attack_dim_expression")
    doc.data["dims"] = {"T": c.choice([{}, {"min": 0}, {"min": 1, "max": 3}])}
    if c.chance(0.5):
        x = doc.input([expression], "float32")
        doc.output(doc.add("exp", [x]))
    else:
        x = doc.input(["T"], "float32")
        doc.output(doc.add("reshape", [x], {"shape": [expression]}))
    return doc.data


def integer_limits(c: Chooser) -> Attack:
    """64-bit integer extremes in constants, indices and starts."""
    value = c.choice([2**64 - 1, 2**63, 2**63 + 5, 2**63 - 1, -(2**63), 2**32 + 1, 2**31])
    dtype = c.choice(["uint64", "int64", "uint32", "int32"])
    doc = Document("attack_integer_limits")
    index = doc.constant(value, dtype)
    kind = c.choice(["const", "take", "indexed_add", "slice", "list"])
    if kind == "const":
        doc.output(index, doc.constant([value, 7], dtype))
        return doc.data
    x = doc.input([4], "float32")
    if kind == "take":
        doc.output(doc.add("take", [x, index], {"axis": 0}))
    elif kind == "indexed_add":
        indices = doc.constant([[value]], dtype)
        updates = doc.constant([1.0], "float32")
        doc.output(doc.add("indexed_add", [x, indices, updates], {"axes": [0]}))
    elif kind == "slice":
        doc.output(doc.add("slice", [x, index], {"lengths": [2], "dynamic_axes": [0]}))
    else:
        doc.output(doc.input([2], dtype))
        return doc.data, {"input_form": "list", "inputs": [[1.0, 2.0, 3.0, 4.0], [value, 7]]}
    return doc.data


def integer_attributes(c: Chooser) -> Attack:
    """An op's attributes with one integer (an index, a size, a stride, a
    count) set to an int64 or int32 extreme, which MLX's C++ shape code
    cannot hold."""
    program = registry_program(c, c.choice(int_attr_ops()))
    for _ in range(8):  # the drawn attributes may hold no integer: draw again
        found = extreme_attrs(c, program)
        if found is not None:
            return found
        program = registry_program(c, c.choice(int_attr_ops()))
    return program


def wrong_types(c: Chooser) -> Attack:
    """A correct small program with one field of the wrong JSON type."""
    doc = Document("attack_wrong_types")
    x = doc.input([2, 3], "float32")
    doc.output(doc.add("sum", [x], {"axes": [1], "keepdims": False}))
    data = doc.data
    edits = [
        lambda d: d["instructions"][0].update(operands=[{"input": "0"}]),
        lambda d: d["instructions"][0].update(operands=[{"input": 0.0}]),
        lambda d: d.update(outputs=[{"result": True}]),
        lambda d: d["instructions"][0]["attrs"].update(axes=["1"]),
        lambda d: d["instructions"][0]["attrs"].update(axes=[1.0]),
        lambda d: d["instructions"][0]["attrs"].update(axes=[True]),
        lambda d: d["instructions"][0]["attrs"].update(keepdims="yes"),
        lambda d: d["instructions"][0]["attrs"].update(keepdims=1),
        lambda d: d["inputs"][0].update(shape=[True, 3]),
        lambda d: d["inputs"][0].update(shape=[2.0, 3]),
        lambda d: d["inputs"][0].update(shape="2,3"),
        lambda d: d["inputs"][0].update(dtype=["float32"]),
        lambda d: d["inputs"][0].update(name=5),
        lambda d: d.update(version="1"),
        lambda d: d.update(version=True),
        lambda d: d.update(version=1.0),
        lambda d: d.update(name=None),
        lambda d: d["instructions"][0].update(op=["sum"]),
        lambda d: d["instructions"][0].update(attrs=[]),
        lambda d: d["instructions"][0].update(operands={"input": 0}),
        lambda d: d.update(dims={"T": {"min": True}}),
        lambda d: d.update(dims={"T": {"max": "1"}}),
        lambda d: d.update(dims={"T": {"min": 1.0}}),
        lambda d: d.update(constants=[{"value": "1", "dtype": "float32"}]),
        lambda d: d.update(constants=[{"value": [1, "nan", True], "dtype": "float32"}]),
        lambda d: d.update(constants=[{"value": 2, "dtype": "bool"}]),
        lambda d: d.update(constants=[{"value": 1.5, "dtype": "int32"}]),
        lambda d: d.update(constants=[{"value": [[1, 2], [3]], "dtype": "int32"}]),
    ]
    c.choice(edits)(data)
    return data


def random_seed_types(c: Chooser) -> Attack:
    """``random_key`` with a seed that is not an integer, or out of range."""
    doc = Document("attack_seed")
    doc.output(doc.add("random_key", [], {"seed": c.choice([True, 1.0, "1", *HOSTILE_INTS])}))
    return doc.data


def noncontiguous_window(c: Chooser) -> Attack:
    """A window op on a reversed, strided or transposed view."""
    doc = Document("attack_noncontiguous")
    view = c.choice(["reverse", "slice", "transpose"])
    op = c.choice(["window_sum", "window_max", "window_min", "window_product"])
    if view == "reverse":
        x = doc.input([6], "float32")
        y = doc.add("reverse", [x], {"axes": [0]})
        windows = [2]
    elif view == "slice":
        x = doc.input([8], "float32")
        y = doc.add("slice", [x], {"lengths": [8], "strides": [2]})
        windows = [2]
    else:
        x = doc.input([3, 4], "float32")
        y = doc.add("transpose", [x], {"axes": [1, 0]})
        windows = [2, 2]
    doc.output(doc.add(op, [y], {"window_dimensions": windows}))
    return doc.data


def many_instructions(c: Chooser) -> Attack:
    """Thousands of instructions, outputs or constants."""
    n = c.choice([1000, 5000, 20000])
    doc = Document("attack_many")
    x = doc.input([2], "float32")
    kind = c.choice(["chain", "outputs", "constants"])
    if kind == "chain":
        ref = x
        for _ in range(n):
            ref = doc.add("negate", [ref])
        doc.output(ref)
    elif kind == "outputs":
        doc.output(*[x] * n)
    else:
        for k in range(n):
            doc.constant(k, "int32")
        doc.output({"const": n - 1})
    return doc.data


def loop_limits(c: Chooser) -> Attack:
    """A ``while`` that never ends, with a huge ``max_iterations`` of its own."""
    doc = Document("attack_loop")
    n = doc.input([], "int32")
    limit = c.choice([10**9, 2**63 - 1, 10**30, 2**31, None])
    cond = {"instructions": [{"op": "greater_equal", "operands": [{"carry": 0},
                                                                   {"carry": 0}]}],
            "outputs": [{"result": 0}]}
    body = {"instructions": [], "outputs": [{"carry": 0}]}
    attrs = {} if limit is None else {"max_iterations": limit}
    doc.output(doc.add("while", [n], attrs, 1, {"cond": cond, "body": body}))
    return doc.data, {"compile": {"max_iterations": 10}}


def hostile_operand_refs(c: Chooser) -> Attack:
    """Refs with hostile indices and kinds."""
    doc = Document("attack_refs")
    x = doc.input([2], "float32")
    ref = c.choice([{"input": 2**63}, {"result": 0}, {"carry": 0}, {"capture": 0},
                    {"const": -1}, {"input": 0, "const": 0}, {}, {"input": hostile(c)}])
    doc.output(doc.add("add", [x, ref]))
    return doc.data


ATTACKS = [zero_size, symbolic_size_one, deep_nesting, huge_result, huge_input,
           huge_intermediate, linalg_special, dim_expression, integer_limits, integer_attributes,
           wrong_types,
           random_seed_types, noncontiguous_window, many_instructions, loop_limits,
           hostile_operand_refs]


def attack(c: Chooser) -> Attack:
    """A program from one of the attacks."""
    return c.choice(ATTACKS)(c)


def to_text(program: Attack) -> tuple[str, dict]:
    """An attack's ``(text, options)``."""
    options: dict = {}
    if isinstance(program, tuple):
        program, options = program
    text = program if isinstance(program, str) else json.dumps(program)
    return text, {k: v for k, v in options.items() if v is not None}
