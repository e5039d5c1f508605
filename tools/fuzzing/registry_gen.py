"""Generator (a): one random op of the registry (sometimes followed by an
elementwise op) on random operands, with attributes drawn from the op's
attribute model: mostly plausible values, sometimes hostile ones, unknown
keys or missing required ones. A quarter of the programs are symbolic (one
axis of the operands becomes a dim ``T``)."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union

import mlxprog as mp
from pydantic import BaseModel

from .choice import Chooser
from .document import DTYPES, SHAPES, UNARY, Document, array_value, elements, is_axis_name
from .hostile import hostile

_HOST_OPS = ("while", "cond", "runtime_call")

# List attributes with one entry per axis of operand 0 (or per spatial axis).
_PER_AXIS = {"lengths", "starts", "strides", "window_dimensions", "window_strides",
             "window_dilations", "stride", "kernel_dilation", "input_dilation", "dilation",
             "output_padding", "slice_sizes", "s", "padding", "pad_width"}
_EINSUM = ["ij,jk->ik", "i,i->", "ij->ji", "ii->i", "ij->", "...i->...", "bij,bjk->bik",
           "i,j->ij", "ij,ij->ij", "iij->j", "->", "ab,bc,cd->ad"]


@dataclass
class Context:
    """What attribute values are drawn against: operand 0's shape, the
    operand count, and the field being drawn."""

    shape: list[int]
    n_operands: int
    field: str = ""

    @property
    def rank(self) -> int:
        return len(self.shape)


def op_names() -> list[str]:
    """Every registered op, sorted (so a seed means the same op everywhere)."""
    return sorted(mp.all_ops())


def registry_program(c: Chooser, name: str | None = None) -> dict:
    """A program around one registry op: ``name``, or a random one."""
    name = name or c.choice(op_names())
    if name in _HOST_OPS:
        return HOST_TEMPLATES[name](c)
    spec = mp.lookup(name)
    doc = Document(f"fuzz_{name}")
    base, dtype = list(c.choice(SHAPES)), c.weighted(DTYPES)
    operand_avals = _operand_avals(c, spec, base, dtype)
    if name.startswith("random_") and operand_avals and c.chance(0.8):
        operand_avals[0] = ([2], "uint32")  # a key, as random ops take one
    refs = [_operand(c, doc, shape, dt) for shape, dt in operand_avals]
    attrs = attributes(c, spec.attrs, Context(base, len(refs)))
    n_out = min(_count_outputs(spec, attrs, len(refs)), 8)
    first = doc.add(name, refs, attrs, n_out)
    outputs = [{"result": first["result"] + k} for k in range(n_out)]
    if c.chance(0.4):
        outputs += _elementwise_chain(c, doc, outputs, refs)
    if c.chance(0.25) and make_symbolic(c, doc.data, base) and c.chance(0.3):
        # The bound value of T as an input (value_of), used on the first result.
        t = doc.input([], "int32", value_of="T")
        outputs.append(doc.add("multiply", [outputs[0], t]))
    doc.output(*outputs)
    return doc.data


def elementwise_ops() -> list[str]:
    """The registry's elementwise ops, sorted."""
    return sorted(n for n, spec in mp.all_ops().items() if spec.family == "elementwise")


def _elementwise_chain(c: Chooser, doc: Document, results: list[dict],
                       inputs: list[dict]) -> list[dict]:
    """One to four elementwise ops on earlier results (so a compiled segment
    fuses them), each output as well; ``astype`` gets a random dtype."""
    made = []
    for _ in range(c.integer(1, 4)):
        op = c.choice(elementwise_ops()) if c.chance(0.7) else c.choice(UNARY)
        lo, _ = mp.lookup(op).operand_range()
        pool = results + made
        operands = [c.choice(pool)] + [c.choice(pool + inputs) for _ in range(lo - 1)]
        attrs = {"dtype": c.weighted(DTYPES)} if op in ("astype", "bitcast") else None
        made.append(doc.add(op, operands, attrs))
    return made


def _operand_avals(c: Chooser, spec, base: list[int], dtype: str) -> list[tuple[list, str]]:
    lo, hi = spec.operand_range()
    if c.chance(0.05):
        n = max(0, lo + c.choice([-1, 1, 5]))  # the wrong operand count
    else:
        n = c.integer(lo, lo + 2 if hi is None else hi)
    avals = []
    for k in range(n):
        shape, dt = list(base), dtype
        if k and c.chance(0.35):
            dt = "int32"  # indices, positions, offsets
        variant = c.weighted([(6, "same"), (2, "broadcast"), (1, "scalar"), (2, "other")])
        if k and variant == "broadcast":
            shape = [1 if c.chance(0.5) else d for d in shape[c.integer(0, len(shape)):]]
        elif k and variant == "scalar":
            shape = []
        elif variant == "other":
            shape, dt = list(c.choice(SHAPES)), c.weighted(DTYPES)
        avals.append((shape, dt))
    return avals


def _operand(c: Chooser, doc: Document, shape: list[int], dtype: str) -> dict:
    if elements(shape) <= 6 and c.chance(0.15):
        return doc.constant(array_value(c, shape, dtype), dtype)
    return doc.input(shape, dtype)


def _count_outputs(spec, attrs: Any, n_operands: int) -> int:
    """The op's result count for these attributes (1 where they are invalid)."""
    try:
        model = spec.attrs.model_validate(attrs)
        count = spec.num_outputs(model, n_operands)
    except Exception:  # invalid attributes: validation will say so
        return 1
    return count if isinstance(count, int) and count >= 1 else 1


# -- attributes -----------------------------------------------------------------

def attributes(c: Chooser, model: type[BaseModel], ctx: Context) -> Any:
    """Attribute values for a model: each field drawn from its type, with a
    small chance of a hostile value, an unknown key or a missing field."""
    if c.chance(0.03):
        return hostile(c)  # attrs that are not an object at all
    attrs: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if not info.is_required() and c.chance(0.3):
            continue  # take the default
        if info.is_required() and c.chance(0.03):
            continue  # a required attribute missing
        field_ctx = Context(ctx.shape, ctx.n_operands, name)
        attrs[name] = hostile(c) if c.chance(0.08) else value_of(c, info.annotation,
                                                                  info.metadata, field_ctx)
    if c.chance(0.04):
        attrs["bogus"] = 1
    return attrs


def value_of(c: Chooser, annotation: Any, metadata: list, ctx: Context) -> Any:
    """A value of a pydantic field type, shaped by the field's name."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return value_of(c, args[0], [*metadata, *args[1:], *_field_metadata(args[1:])], ctx)
    if origin in (Union, types.UnionType):
        arms = [a for a in args if a is not type(None)]
        if len(arms) < len(args) and c.chance(0.25):
            return None
        return value_of(c, c.choice(arms), metadata, ctx)
    if origin is Literal:
        return c.choice(args)
    if origin in (list, tuple):
        return _list_value(c, origin, args, ctx)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {name: value_of(c, info.annotation, info.metadata, ctx)
                for name, info in annotation.model_fields.items()}
    if annotation is bool:
        return c.choice([False, True])
    if annotation is int:
        return _int_value(c, metadata, ctx)
    if annotation is float:
        return c.choice([1.0, 0.5, 0.0, 2.0, 1e-5, -1.0, 10.0])
    if annotation is str:
        return _str_value(c, ctx)
    return hostile(c)


def _field_metadata(items) -> list:
    """Constraints held inside a nested ``Field(...)`` of an Annotated type."""
    return [m for item in items for m in getattr(item, "metadata", [])]


def _lower_bound(metadata: list) -> int | None:
    return next((m.ge for m in metadata if hasattr(m, "ge")), None)


def _is_axis(metadata: list, ctx: Context) -> bool:
    return any(type(m).__name__ == "AxisOf" for m in metadata) or is_axis_name(ctx.field)


def _int_value(c: Chooser, metadata: list, ctx: Context) -> int:
    if _is_axis(metadata, ctx):
        return c.integer(-ctx.rank, ctx.rank - 1) if ctx.rank else c.choice([0, -1])
    lo = _lower_bound(metadata)
    if ctx.field in ("group_size",):
        return c.choice([32, 64, 128, 16])
    if ctx.field in ("bits",):
        return c.choice([4, 8, 2, 3, 5, 6])
    small = c.integer(0 if lo is None else lo, 4)
    return small if lo is not None or c.chance(0.8) else -small


def _str_value(c: Chooser, ctx: Context) -> str:
    if ctx.field == "dtype":
        return c.weighted(DTYPES) if c.chance(0.95) else c.choice(["float", "f32", "int", ""])
    if ctx.field == "subscripts":
        return c.choice(_EINSUM)
    if ctx.field == "callback":
        return "cb"
    return c.choice(["x", "", "nan"])


def _list_value(c: Chooser, origin, args, ctx: Context) -> list:
    if origin is tuple and len(args) == 2 and args[1] is not Ellipsis:
        return [value_of(c, a, [], ctx) for a in args]
    item = args[0] if args else int
    if ctx.field == "shape":
        return _shape_value(c, ctx)
    if is_axis_name(ctx.field):
        axes = c.sample(range(ctx.rank), c.integer(0, ctx.rank))
        return [a - ctx.rank if c.chance(0.3) else a for a in axes]
    if ctx.field in _PER_AXIS:
        length = c.choice([ctx.rank, max(ctx.rank - 2, 0), 1, ctx.rank + 1])
    else:
        length = c.integer(0, 3)
    if _is_size_list(ctx):
        return [_size_entry(c, ctx, k) for k in range(length)]
    return [value_of(c, item, [], ctx) for _ in range(length)]


def _is_size_list(ctx: Context) -> bool:
    return ctx.field in ("lengths", "slice_sizes", "s", "window_dimensions")


def _size_entry(c: Chooser, ctx: Context, k: int) -> int:
    """An entry of a per-axis size list, at most the operand's size there."""
    limit = ctx.shape[k] if k < ctx.rank else 2
    return c.integer(1 if ctx.field != "lengths" else 0, max(limit, 1))


def _shape_value(c: Chooser, ctx: Context) -> list[int]:
    """A ``shape`` attribute: operand 0's shape, a variant of it, or new."""
    shape = list(ctx.shape)
    kind = c.weighted([(3, "same"), (2, "prefix"), (2, "flat"), (2, "new")])
    if kind == "prefix":
        return [c.integer(1, 3), *shape]
    if kind == "flat":
        return [elements(shape)] if c.chance(0.5) else [-1]
    if kind == "new" or not ctx.n_operands:
        return list(c.choice(SHAPES))
    return shape


# -- symbolic programs ------------------------------------------------------------

def make_symbolic(c: Chooser, data: dict, base: list[int]) -> bool:
    """Turn one axis of ``base`` into the dim ``T`` in every input of that
    shape; False when no input has it."""
    axes = [k for k, d in enumerate(base) if d >= 1]
    matching = [spec for spec in data["inputs"] if spec["shape"] == base]
    if not axes or not matching:
        return False
    axis = c.choice(axes)
    spec = {"min": c.choice([1, 0, 2])}
    if c.chance(0.3):
        spec["max"] = spec["min"] + c.choice([4, 0, 16])
    data["dims"] = {"T": spec}
    for input_spec in matching:
        input_spec["shape"] = [*base[:axis], "T", *base[axis + 1:]]
    return True


# -- host ops -----------------------------------------------------------------

def _while_program(c: Chooser) -> dict:
    """``while`` counting to a limit while applying a unary op to a value."""
    doc = Document("fuzz_while")
    shape, dtype = list(c.choice(SHAPES)), c.weighted(DTYPES)
    counter = doc.input([], "int32") if c.chance(0.7) else doc.constant(0, "int32")
    value = doc.input(shape, dtype)
    limit = doc.constant(c.choice([3, 0, 1, 50, 1000, 10**6]), "int32")
    one = doc.constant(1, "int32")
    attrs = {}
    if c.chance(0.5):
        attrs["max_iterations"] = c.choice([10, 1, 1000, 10**9, 2**63 - 1, 10**30, 0, -1])
    cond = {"instructions": [{"op": "less", "operands": [{"carry": 0}, limit]}],
            "outputs": [{"result": 0}]}
    body = {"instructions": [{"op": "add", "operands": [{"carry": 0}, one]},
                             {"op": c.choice(UNARY), "operands": [{"carry": 1}]}],
            "outputs": [{"result": 0}, {"result": 1}]}
    result = doc.add("while", [counter, value], attrs, 2, {"cond": cond, "body": body})
    return doc.output(result, {"result": result["result"] + 1}).data


def _cond_program(c: Chooser) -> dict:
    """``cond`` choosing between two unary ops of its carry."""
    doc = Document("fuzz_cond")
    shape, dtype = list(c.choice(SHAPES)), c.weighted(DTYPES)
    predicate = doc.input([], c.choice(["bool", "int32", "float32", "uint64"]))
    value = doc.input(shape, dtype)
    branches = {name: {"instructions": [{"op": c.choice(UNARY), "operands": [{"carry": 0}]}],
                       "outputs": [{"result": 0}]} for name in ("then", "else")}
    result = doc.add("cond", [predicate, value], None, 1, branches)
    return doc.output(result).data


def _runtime_call_program(c: Chooser) -> dict:
    """``runtime_call`` of a callback declared to return random arrays."""
    doc = Document("fuzz_runtime_call")
    operands = [doc.input(list(c.choice(SHAPES)), c.weighted(DTYPES))
                for _ in range(c.integer(0, 2))]
    outputs = [{"shape": list(c.choice(SHAPES)), "dtype": c.weighted(DTYPES)}
               for _ in range(c.integer(0, 2))]
    if c.chance(0.1):
        outputs = hostile(c)
    first = doc.add("runtime_call", operands, {"callback": "cb", "outputs": outputs},
                    len(outputs) if isinstance(outputs, list) else 1)
    if isinstance(outputs, list) and outputs:
        doc.output(first)
    return doc.data


HOST_TEMPLATES = {"while": _while_program, "cond": _cond_program,
                  "runtime_call": _runtime_call_program}
