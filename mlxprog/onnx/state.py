"""What the import of one model keeps across its graphs: :class:`ImportState`.

The program builder, the weights and captures declared so far, the
program's dims and the names the model gives them, and the symbolic shape
of each builder value (:meth:`ImportState.symbolic_shape`): ONNX's own
shape inference where it knows an axis, else solved from the program built
so far (:func:`solve_sizes`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction

import mlx.core as mx
import numpy as np
import onnx

from ..builder import ProgramBuilder, Value
from ..errors import ProgramError
from ..symbolic.expr import evaluate, parse
from ..symbolic.specialize import specialize
from ..validate import validate
from .dtypes import BFLOAT16, dtype_name, numpy_dtype
from .errors import OnnxImportError
from .symbolic import dim

#: Symbolic sizes are solved from 2**dims bindings (beyond this many dims,
#: a dim's sample size names the dim, and other sizes are taken as numbers).
MAX_SOLVED_DIMS = 4
#: Folded constants with more elements than this become captures (weights)
#: rather than constants written into the program's JSON.
MAX_INLINE_CONSTANT = 256

Shape = tuple[int | str | None, ...]


class ImportState:
    """One model's import: ``b`` is the program's builder, ``opset`` the
    model's opset of the default domain, ``inferred`` ONNX's shape inference
    of every value (subgraphs included) by name, ``weights`` the captures'
    arrays by capture name."""

    def __init__(self, name: str, opset: int, inferred: Mapping[str, Shape]):
        self.b = ProgramBuilder(name)
        self.opset = opset
        self.inferred = inferred
        self.weights: dict[str, np.ndarray | mx.array] = {}
        #: The ONNX element type of each shape value (object array), by name.
        self.shape_dtypes: dict[str, np.dtype] = {}
        self._dims: dict[str, str] = {}  # dim_param -> declared dim name
        self._captures: dict[str, Value] = {}
        self._solved: dict[int, tuple[Value, list[int | str]]] = {}

    # -- values known at import -------------------------------------------------------

    def known_value(self, name: str, array: np.ndarray, initializer: bool = False) -> Value:
        """``array``, known at import, as a builder value: an initializer
        (``initializer``: the capture ``name``) or an array of more than
        :data:`MAX_INLINE_CONSTANT` elements (the capture ``folded.<name>``)
        as a capture, a smaller one as a program constant. Captures and
        constants are declared once, and belong to every builder scope."""
        if not initializer and array.size <= MAX_INLINE_CONSTANT:
            return self.b.constant(array.tolist(), dtype_name(array.dtype))
        capture_name = name if initializer else f"folded.{name}"
        if capture_name not in self.weights:
            # A bfloat16 weight as an mx.array: mlxprog's bindings take
            # NumPy's ml_dtypes form of it nowhere (they read float32 as
            # bfloat16), and the safetensors writer keeps it bfloat16.
            self.weights[capture_name] = mx.array(array) if array.dtype == BFLOAT16 else array
            self._captures[capture_name] = self.b.capture(capture_name, list(array.shape),
                                                          dtype_name(array.dtype))
        return self._captures[capture_name]

    # -- the program's inputs ---------------------------------------------------------

    def declare_input(self, spec: onnx.ValueInfoProto) -> Value:
        """A graph input as a program input, named dims (``dim_param``) and
        unknown ones as symbolic dims."""
        where = f"graph input {spec.name!r}"
        tensor = spec.type.tensor_type
        if not spec.type.HasField("tensor_type"):
            raise OnnxImportError(f"{where}: only tensor inputs are supported "
                                  f"(found {spec.type.WhichOneof('value')})")
        dtype = numpy_dtype(tensor.elem_type, where)
        shape: list[int | str] = []
        for axis, size in enumerate(tensor.shape.dim):
            if size.HasField("dim_value"):
                shape.append(size.dim_value)
                continue
            param = size.dim_param or f"{spec.name}_{axis}"
            if param not in self._dims:
                name = re.sub(r"\W", "_", param)
                if not name or name[0].isdigit():
                    name = f"d_{name}"
                while name in self.b.dims:
                    name += "_"
                self._dims[param] = self.b.dim(name)
            shape.append(self._dims[param])
        return self.b.input(spec.name, shape, dtype_name(dtype))

    # -- symbolic shapes ---------------------------------------------------------------

    def symbolic_shape(self, value: Value, name: str | None = None,
                       layout: Sequence[int] | None = None) -> tuple[int | str, ...]:
        """A value's logical shape with symbolic dims by name or expression
        (``name``: the ONNX value it holds, whose inferred shape helps;
        ``layout``: the axes of ``value`` in logical order, for a
        channels-last value).

        While building, a builder value's shape holds sizes at one sample
        binding of the dims, which cannot tell a dim from a number (7 is the
        first sample) nor ``12*N`` from 84. Where ONNX's shape inference
        knows an axis (a number, or an input's ``dim_param``) that answer
        wins; the other axes are solved from the value's sizes at other
        bindings (:func:`solve_sizes`)."""
        sizes = list(value.shape)
        if not self.b.dims:
            return tuple(sizes if layout is None else [sizes[a] for a in layout])
        known = self.inferred.get(name) if name else None
        if layout is not None and known is not None:
            # ONNX's answer is in logical order; ``value``'s axes are not.
            known = tuple(known[layout.index(a)] for a in range(len(layout)))
        if known is not None and len(known) != len(sizes):
            known = None
        shape: list[int | str | None] = []
        for axis, size in enumerate(sizes):
            hint = known[axis] if known is not None else None
            if isinstance(hint, int) and hint == size:
                shape.append(size)
            elif isinstance(hint, str) and hint in self._dims:
                shape.append(self._dims[hint])
            else:
                shape.append(None)
        if None in shape:
            # Converters ask for a shape again and again: solve each value once
            # (the value is kept with its answer, so its id is not reused).
            if id(value) not in self._solved:
                axes = [a for a, d in enumerate(shape) if d is None]
                self._solved[id(value)] = (value, self._solve(value, axes))
            solved = list(self._solved[id(value)][1])
            shape = [solved.pop(0) if d is None else d for d in shape]
        return tuple(shape if layout is None else [shape[a] for a in layout])

    def _solve(self, value: Value, axes: list[int]) -> list[int | str]:
        """The sizes of ``axes`` of ``value`` as dim expressions, from the
        program built so far specialised at several bindings (a value of a
        subprogram: by its sample sizes, a dim's sample naming the dim)."""
        sample = self.b.sample_sizes
        if value.builder is self.b and len(self.b.dims) <= MAX_SOLVED_DIMS:
            program = self.b.build([value], check=False)

            def sizes_at(bindings: dict[str, int]) -> list[int] | None:
                try:
                    aval = validate(specialize(program, bindings)).out_avals[0]
                except ProgramError:
                    return None
                return [aval.shape[a] for a in axes]

            solved = solve_sizes(sizes_at, sample)
            if solved is not None:
                return solved
        by_sample = {size: d for d, size in sample.items()}
        return [by_sample.get(value.shape[a], value.shape[a]) for a in axes]


def solve_sizes(sizes_at: Callable[[dict[str, int]], list[int] | None],
                sample: dict[str, int]) -> list[int | str] | None:
    """Sizes as dim expressions: ``sizes_at(bindings)`` gives the sizes at a
    binding (None: the program is invalid there). Each size is taken to be
    multilinear in the dims (``B*T+2*T+1``: what reshapes, concatenations and
    slices make of them); it is interpolated from the ``2**k`` bindings with
    each dim at its sample or at a second value, and checked at a third
    binding. None when a binding fails or a size is not of that form."""
    dims = list(sample)
    other = {d: 2 * v + 3 for d, v in sample.items()}
    corners = {}
    for mask in range(2 ** len(dims)):
        binding = {d: other[d] if mask >> k & 1 else sample[d] for k, d in enumerate(dims)}
        sizes = sizes_at(binding)
        if sizes is None:
            return None
        corners[mask] = sizes
    exprs = []
    for axis in range(len(corners[0])):
        poly = _multilinear({m: v[axis] for m, v in corners.items()}, dims, sample, other)
        if poly is None:
            return None
        exprs.append(poly)
    check = {d: 3 * v + 5 for d, v in sample.items()}
    if sizes_at(check) != [evaluate(parse(e), check) for e in exprs]:
        return None
    return [dim(e) for e in exprs]


def _multilinear(values: dict[int, int], dims: list[str], low: dict[str, int],
                 high: dict[str, int]) -> str | None:
    """The multilinear polynomial through ``values`` (corner mask -> value;
    bit k of a mask: dim k at ``high``, else at ``low``) as an expression,
    or None when a coefficient is not an integer."""
    # Lagrange basis per dim: x at low is (high - x)/(high - low), at high (x - low)/(high - low).
    poly: dict[frozenset, Fraction] = {}
    for mask, value in values.items():
        terms = {frozenset(): Fraction(value)}
        for k, d in enumerate(dims):
            span = high[d] - low[d]
            # (x - low)/span at high, (high - x)/span at low: a*x + b.
            a, b = (Fraction(1, span), Fraction(-low[d], span)) if mask >> k & 1 else \
                (Fraction(-1, span), Fraction(high[d], span))
            new: dict[frozenset, Fraction] = {}
            for mono, c in terms.items():
                new[mono | {d}] = new.get(mono | {d}, 0) + c * a
                new[mono] = new.get(mono, 0) + c * b
            terms = new
        for mono, c in terms.items():
            poly[mono] = poly.get(mono, 0) + c
    if any(c.denominator != 1 for c in poly.values()):
        return None
    return "+".join("*".join([str(int(c)), *sorted(m)]) for m, c in poly.items() if c) or "0"
