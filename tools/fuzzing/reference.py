"""A numpy reference for ops where one is cheap, so the fuzzer checks what
an op computes, not only that compiled and eager agree (they share one
lowering: an op defined wrong everywhere passes that comparison).

:data:`REFERENCE` maps an op name to ``fn(operands, attrs) -> array``:
numpy on the operand values. The worker applies it to each program output
that an instruction computes straight from inputs and constants (its
operands are known exactly), with the validated attributes (axes
normalised). Rules:

- floating operands are computed in float64 (complex in complex128), so
  the reference is at least as precise as MLX; the result is then cast to
  the dtype MLX returned (dtype promotion is MLX's business and is not
  checked here);
- integer operands are computed in int64 / uint64 (in float64 for the ops
  that MLX computes in a float, :data:`_FLOAT_VALUED`); casting to the
  result dtype wraps as MLX's fixed-width arithmetic does;
- values compare within :data:`RTOL` of the result dtype (relative, with the
  same bound as an absolute floor), NaN positions exactly, infinities by
  sign; a sum of many terms (:data:`SCALE`) within that tolerance of the
  sum of their magnitudes, since rounding in the accumulation is relative
  to the terms, not to a result that cancels;
- an op is left out where its definition is not numpy's (shifts, integer
  division by zero, ``round`` of halves, argsort ties) or its reference is
  not cheap.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

Fn = Callable[[list[np.ndarray], Any], np.ndarray]

RTOL = {"float16": 4e-3, "bfloat16": 3e-2, "float32": 2e-5, "float64": 1e-10,
        "complex64": 2e-5}
"""Relative (and absolute floor) tolerance of a result dtype; exact otherwise."""

FLOAT64_AS_FLOAT32 = {"exp", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tanh",
                      "sinh", "cosh", "atan", "asinh", "atan2", "sigmoid", "logsumexp",
                      "softmax"}
"""Ops that MLX (0.32, CPU) computes to float32 accuracy on float64 operands
(``exp(1.0)`` is ``2.7182817459106445``): their float64 results compare at
float32's tolerance, so the oracle reports other defects. A known MLX
limitation, listed so it is not rediscovered on every run."""


def _unary(fn) -> Fn:
    return lambda xs, attrs: fn(xs[0])


def _binary(fn) -> Fn:
    return lambda xs, attrs: fn(xs[0], xs[1])


def _axes(attrs) -> Any:
    axes = getattr(attrs, "axes", None)
    return None if axes is None else tuple(axes)


def _reduction(fn) -> Fn:
    return lambda xs, attrs: fn(xs[0], axis=_axes(attrs), keepdims=attrs.keepdims)


def _logsumexp(xs, attrs) -> np.ndarray:
    x, axes = xs[0], _axes(attrs)
    top = np.max(x, axis=axes, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)
    out = np.log(np.sum(np.exp(x - top), axis=axes, keepdims=True)) + top
    return out if attrs.keepdims else np.squeeze(out, axis=axes if axes is not None
                                                 else tuple(range(x.ndim)))


def _softmax(xs, attrs) -> np.ndarray:
    x, axes = xs[0], _axes(attrs)
    e = np.exp(x - np.max(x, axis=axes, keepdims=True))
    return e / np.sum(e, axis=axes, keepdims=True)


def _scan(fn, identity: int | None) -> Fn:
    def scan(xs, attrs):
        x, axis = xs[0], attrs.axis
        if axis is None:
            x, axis = x.reshape(-1), 0
        if not attrs.inclusive and identity is None:
            return None  # an exclusive max or min starts from the dtype's extreme
        if attrs.reverse:
            x = np.flip(x, axis)
        out = fn(x, axis=axis)
        if not attrs.inclusive and out.shape[axis]:  # shifted by one, the identity first
            head = np.full_like(np.take(out, [0], axis=axis), identity)
            out = np.concatenate([head, np.take(out, range(out.shape[axis] - 1), axis=axis)],
                                 axis=axis)
        return np.flip(out, axis) if attrs.reverse else out
    return scan


REFERENCE: dict[str, Fn] = {
    # elementwise, one operand
    "abs": _unary(np.abs), "negate": _unary(np.negative), "square": _unary(np.square),
    "exp": _unary(np.exp), "expm1": _unary(np.expm1), "log": _unary(np.log),
    "log1p": _unary(np.log1p), "log2": _unary(np.log2), "log10": _unary(np.log10),
    "sqrt": _unary(np.sqrt), "rsqrt": _unary(lambda x: 1 / np.sqrt(x)),
    "reciprocal": _unary(lambda x: 1 / x), "sin": _unary(np.sin), "cos": _unary(np.cos),
    "tanh": _unary(np.tanh), "sinh": _unary(np.sinh), "cosh": _unary(np.cosh),
    "atan": _unary(np.arctan), "asinh": _unary(np.arcsinh),
    "floor": _unary(np.floor), "ceil": _unary(np.ceil),
    "sigmoid": _unary(lambda x: 1 / (1 + np.exp(-x))),
    "logical_not": _unary(np.logical_not), "is_nan": _unary(np.isnan),
    "is_infinity": _unary(np.isinf), "conjugate": _unary(np.conjugate),
    "real": _unary(np.real), "imag": _unary(np.imag),
    # elementwise, two operands
    "add": _binary(np.add), "subtract": _binary(np.subtract),
    "multiply": _binary(np.multiply), "maximum": _binary(np.maximum),
    "max": _binary(np.maximum), "min": _binary(np.minimum),
    "equal": _binary(np.equal), "not_equal": _binary(np.not_equal),
    "less": _binary(np.less), "less_equal": _binary(np.less_equal),
    "greater": _binary(np.greater), "greater_equal": _binary(np.greater_equal),
    "logical_and": _binary(np.logical_and), "logical_or": _binary(np.logical_or),
    "logical_xor": _binary(np.logical_xor), "bitwise_and": _binary(np.bitwise_and),
    "bitwise_or": _binary(np.bitwise_or), "bitwise_xor": _binary(np.bitwise_xor),
    "atan2": _binary(np.arctan2),
    # reductions and scans
    "sum": _reduction(np.sum), "product": _reduction(np.prod), "mean": _reduction(np.mean),
    "reduce_max": _reduction(np.max), "reduce_min": _reduction(np.min),
    "all": _reduction(np.all), "any": _reduction(np.any),
    "var": lambda xs, a: np.var(xs[0], axis=_axes(a), keepdims=a.keepdims, ddof=a.ddof),
    "std": lambda xs, a: np.std(xs[0], axis=_axes(a), keepdims=a.keepdims, ddof=a.ddof),
    "logsumexp": _logsumexp, "softmax": _softmax,
    "cumulative_sum": _scan(np.cumsum, 0), "cumulative_product": _scan(np.cumprod, 1),
    "cumulative_max": _scan(np.maximum.accumulate, None),
    "cumulative_min": _scan(np.minimum.accumulate, None),
    # ascending only: where a descending sort puts NaN is MLX's choice
    "sort": lambda xs, a: None if a.descending else np.sort(xs[0], axis=a.axis),
    # shapes
    "reshape": lambda xs, a: np.reshape(xs[0], a.shape),
    "transpose": lambda xs, a: np.transpose(xs[0], a.axes),
    "squeeze": lambda xs, a: np.squeeze(xs[0], _axes(a)),
    "expand_dims": lambda xs, a: np.expand_dims(xs[0], tuple(a.axes)),
    "reverse": lambda xs, a: np.flip(xs[0], tuple(a.axes)),
    "broadcast_to": lambda xs, a: np.broadcast_to(xs[0], a.shape),
    "concatenate": lambda xs, a: np.concatenate(xs, axis=a.axis),
    "stack": lambda xs, a: np.stack(xs, axis=a.axis),
    # contractions
    "matmul": _binary(np.matmul),
}


_FLOAT_VALUED = {"exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt",
                 "reciprocal", "sin", "cos", "tanh", "sinh", "cosh", "atan", "asinh",
                 "sigmoid", "atan2", "mean", "var", "std", "logsumexp", "softmax"}
"""Ops whose integer and bool operands MLX converts to a float first."""


def _magnitude(reduce_fn) -> Fn:
    """The sum of the terms' magnitudes, as a reduction (see :data:`SCALE`)."""
    def scale(xs, attrs):
        x = np.abs(xs[0])
        return reduce_fn(x, axis=_axes(attrs), keepdims=attrs.keepdims) * _terms(x, attrs)
    return scale


def _terms(x: np.ndarray, attrs) -> float:
    """How far past 256 terms a reduction's accumulated rounding may grow."""
    axes = _axes(attrs)
    n = x.size if axes is None else int(np.prod([x.shape[a] for a in axes]))
    return max(1.0, n / 256)


SCALE: dict[str, Fn] = {
    "matmul": lambda xs, a: np.matmul(np.abs(xs[0]), np.abs(xs[1])) *
    max(1.0, xs[0].shape[-1] / 256),
    "sum": _magnitude(np.sum), "mean": _magnitude(np.mean),
}
"""op -> the magnitude its result's rounding is relative to, where that is
not the result itself (sums of many terms that may cancel)."""


def widen(x: np.ndarray, to_float: bool = False) -> np.ndarray:
    """An operand as the reference computes with it (see the module rules);
    ``to_float``: integers and bools as float64 too."""
    if to_float and x.dtype.kind in "biu":
        return x.astype(np.float64)
    if x.dtype.kind == "f":
        return x.astype(np.float64)
    if x.dtype.kind == "c":
        return x.astype(np.complex128)
    if x.dtype.kind == "i":
        return x.astype(np.int64)
    if x.dtype.kind == "u":
        return x.astype(np.uint64)
    return x


def compute(op: str, operands: list[np.ndarray], attrs: Any
            ) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The reference result of ``op`` and the magnitude its rounding is
    relative to (None: the result's own), or None where there is none."""
    fn = REFERENCE.get(op)
    if fn is None:
        return None
    kinds = {x.dtype.kind for x in operands}
    if op in ("sort", "cumulative_max", "cumulative_min", "reduce_max", "reduce_min",
              "max", "min") and "c" in kinds:
        return None  # complex ordering is MLX's own
    if len(kinds) > 1 and op not in ("matmul",) and kinds & {"u"} and kinds & {"i", "b"}:
        return None  # numpy promotes uint64 with int64 to float64
    with np.errstate(all="ignore"):
        try:
            wide = [widen(x, op in _FLOAT_VALUED) for x in operands]
            out = fn(wide, attrs)
            scale = SCALE[op](wide, attrs) if op in SCALE and out is not None else None
        except (ValueError, TypeError, OverflowError):
            return None  # an operand numpy takes differently (MLX validated it)
    if out is None:
        return None
    return np.asarray(out), None if scale is None else np.abs(np.asarray(scale))


def mismatch(got: np.ndarray, dtype: str, want: np.ndarray, op: str = "",
             scale: np.ndarray | None = None) -> str | None:
    """How MLX's result of ``op`` differs from the reference ``want`` (whose
    rounding is relative to ``scale``, default itself), or None."""
    if dtype == "float64" and op in FLOAT64_AS_FLOAT32:
        dtype = "float32"
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {list(got.shape)} vs the reference's {list(want.shape)}"
    with np.errstate(all="ignore"):
        if got.dtype.kind in "biu":
            if want.dtype.kind in "fc" and not np.all(np.isfinite(want)):
                return None  # a non-finite value cast to an integer is undefined
            want = want.astype(got.dtype)
            bad = got != want
        else:
            rtol = RTOL.get(dtype, 0.0)
            if got.dtype.kind == "c":
                return mismatch(got.real, dtype, np.real(want), op, scale) or \
                    mismatch(got.imag, dtype, np.imag(want), op, scale)
            want = np.real(want).astype(np.float64)
            x = got.astype(np.float64)
            want = want.astype(got.dtype).astype(np.float64)  # the result dtype's rounding
            nan_x, nan_w = np.isnan(x), np.isnan(want)
            magnitude = np.maximum(np.abs(x), np.abs(want))
            if scale is not None:
                magnitude = np.maximum(magnitude, np.broadcast_to(scale, magnitude.shape))
            close = np.abs(x - want) <= rtol * magnitude + rtol
            same_inf = np.isinf(x) & (x == want)
            bad = (nan_x != nan_w) | (~nan_x & ~nan_w & ~close & ~same_inf)
    if not np.any(bad):
        return None
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"{int(np.sum(bad))} of {got.size} elements differ from the numpy reference, "
            f"first at {list(index)}: {got[index]!r} vs {want[index]!r}")
