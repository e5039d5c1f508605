"""Reductions, scans, sorting and softmax.

Result dtypes follow MLX: ``sum`` and ``product`` accumulate small integers and
bool in 32 bits, ``mean``/``var``/``std``/``logsumexp``/``softmax`` give floats
(float32 for integer and bool inputs), ``all`` and ``any`` give bool,
``argmax``/``argmin``/``argsort`` give uint32.

Reducing over an empty axis gives the identity where there is one: ``sum``
0, ``product`` 1, ``all`` true, ``any`` false; ``mean``, ``var`` and ``std``
give NaN (0 / 0). ``reduce_max``, ``reduce_min``, ``argmax`` and ``argmin``
of no elements have no value and are rejected at validation, as is
``logsumexp`` (MLX computes none; mathematically -inf). MLX computes
``logsumexp``, ``argmax`` and ``argmin`` of non-empty arrays only, so these
three reject any zero-size operand, even where the reduced axes are not empty.
Scans, sorts and ``softmax`` of an empty array give an empty array.

Every op here but ``logsumexp``, ``sort`` and ``argsort`` is shapeless: one
trace serves every binding of a symbolic program.
"""

from __future__ import annotations

import mlx.core as mx
from pydantic import Field

from ..arrays import AVal, is_floating
from .attrs import Attrs, Axes, Axis
from .registry import register_family, register_op


class ReduceAttrs(Attrs):
    axes: Axes | None = None
    """The axes to reduce; default: all."""
    keepdims: bool = False
    """Keep the reduced axes, with size 1."""


def _in_float(x: mx.array) -> mx.array:
    """``x`` as float32 when it is an integer or bool array: MLX's ``mean``,
    ``var`` and ``std`` sum integers in their own dtype before dividing,
    which wraps (the mean of int32 ``[2**31 - 1, 2**31 - 1, 5, 7]`` came out
    2.5); their result is float32 anyway."""
    return x if is_floating(x.dtype) else x.astype(mx.float32)


def _mean(x: mx.array, axis=None, keepdims: bool = False) -> mx.array:
    """``mx.mean`` summing integers in float32 (see :func:`_in_float`)."""
    return mx.mean(_in_float(x), axis=axis, keepdims=keepdims)


def _reduction(fn, operands, attrs):
    """A reduction ``fn`` (``mx.sum``, ...) of operand 0 over ``axes``."""
    return fn(operands[0], axis=attrs.axes, keepdims=attrs.keepdims)


def _require_elements(operand: AVal, axes: list[int] | None, operand_too: bool) -> None:
    """The reduced ``axes`` (None: all) of ``operand`` are not empty and, with
    ``operand_too``, neither is any other axis (MLX reduces no zero-size array)."""
    shape = operand.shape
    empty = [a for a in (range(len(shape)) if axes is None else axes) if shape[a] == 0]
    if empty:
        raise ValueError(
            f"a reduction over no elements has no value: axis {empty[0]} of operand 0 "
            f"{operand} is empty"
        )
    if operand_too and 0 in shape:
        raise ValueError(
            f"MLX cannot compute this reduction of a zero-size operand, even over "
            f"non-empty axes; found {operand}"
        )


def _check_max_min(avals: list[AVal], attrs: ReduceAttrs) -> None:
    """The reduced axes are not empty."""
    _require_elements(avals[0], attrs.axes, operand_too=False)


def _check_logsumexp(avals: list[AVal], attrs: ReduceAttrs) -> None:
    """The operand is not empty."""
    _require_elements(avals[0], attrs.axes, operand_too=True)


_AXES_DOC = "over ``axes`` (default: all axes); ``keepdims`` keeps them as size 1."

_REDUCTIONS = {
    "sum": (mx.sum, f"Sum {_AXES_DOC} Over no elements: 0."),
    "product": (mx.prod, f"Product {_AXES_DOC} Over no elements: 1."),
    "mean": (_mean, f"Arithmetic mean {_AXES_DOC} Over no elements: NaN."),
    "all": (mx.all, f"True where every element is nonzero, {_AXES_DOC} Result is bool; "
                    "true over no elements."),
    "any": (mx.any, f"True where some element is nonzero, {_AXES_DOC} Result is bool; "
                    "false over no elements."),
}

register_family(_REDUCTIONS, _reduction, attrs=ReduceAttrs, shapeless=True)

register_family(
    {
        "reduce_max": (mx.max, f"Maximum {_AXES_DOC} NaN propagates. An empty reduced "
                               "axis is rejected (no value)."),
        "reduce_min": (mx.min, f"Minimum {_AXES_DOC} NaN propagates. An empty reduced "
                               "axis is rejected (no value)."),
    },
    _reduction, attrs=ReduceAttrs, check=_check_max_min, shapeless=True,
)

register_family(
    {"logsumexp": (mx.logsumexp, f"``log(sum(exp(x)))`` computed stably, {_AXES_DOC} "
                                 "A zero-size operand is rejected (MLX computes none).")},
    # Not shapeless: MLX's logsumexp reshapes to the traced shape of the
    # axes it keeps, so one trace cannot serve other sizes of them.
    _reduction, attrs=ReduceAttrs, check=_check_logsumexp,
)


class VarianceAttrs(Attrs):
    axes: Axes | None = None
    """The axes to reduce; default: all."""
    keepdims: bool = False
    """Keep the reduced axes, with size 1."""
    ddof: int = Field(default=0, ge=0)
    """Delta degrees of freedom: the divisor is the element count minus ``ddof``."""


@register_op("var", attrs=VarianceAttrs, shapeless=True)
def var(operands, attrs):
    """Variance over ``axes`` (default: all axes), dividing by ``N - ddof``;
    ``keepdims`` keeps the reduced axes as size 1. Where ``N - ddof <= 0`` the
    divisor is 0: inf, or NaN where the elements are all equal (and over no
    elements)."""
    return mx.var(_in_float(operands[0]), axis=attrs.axes, keepdims=attrs.keepdims, ddof=attrs.ddof)


@register_op("std", attrs=VarianceAttrs, shapeless=True)
def std(operands, attrs):
    """Standard deviation over ``axes`` (default: all axes), dividing by
    ``N - ddof``; ``keepdims`` keeps the reduced axes as size 1. Where
    ``N - ddof <= 0``: inf, or NaN, as ``var``."""
    return mx.std(_in_float(operands[0]), axis=attrs.axes, keepdims=attrs.keepdims, ddof=attrs.ddof)


class ArgReduceAttrs(Attrs):
    axis: Axis | None = None
    """The axis to search; default: the flattened array."""
    keepdims: bool = False
    """Keep the reduced axis (every axis, without ``axis``), with size 1."""


def _check_arg_reduce(avals: list[AVal], attrs: ArgReduceAttrs) -> None:
    """The operand is not empty."""
    _require_elements(avals[0], None if attrs.axis is None else [attrs.axis],
                      operand_too=True)


@register_op("argmax", attrs=ArgReduceAttrs, check=_check_arg_reduce, shapeless=True)
def argmax(operands, attrs):
    """Index of the first maximum along ``axis`` (default: over the flattened
    array; with ``keepdims`` every axis is kept as size 1). Result is uint32.
    A zero-size operand is rejected (MLX computes none)."""
    return mx.argmax(operands[0], axis=attrs.axis, keepdims=attrs.keepdims)


@register_op("argmin", attrs=ArgReduceAttrs, check=_check_arg_reduce, shapeless=True)
def argmin(operands, attrs):
    """Index of the first minimum along ``axis`` (default: over the flattened
    array; with ``keepdims`` every axis is kept as size 1). Result is uint32.
    A zero-size operand is rejected (MLX computes none)."""
    return mx.argmin(operands[0], axis=attrs.axis, keepdims=attrs.keepdims)


class ScanAttrs(Attrs):
    axis: Axis | None = None
    """The axis to scan; default: the flattened array."""
    reverse: bool = False
    """Scan from the end."""
    inclusive: bool = True
    """Include each position's own element; false shifts the scan by one."""


def _scan(fn, operands, attrs):
    """A scan ``fn`` (``mx.cumsum``, ...) of operand 0 along ``axis``."""
    return fn(operands[0], axis=attrs.axis, reverse=attrs.reverse, inclusive=attrs.inclusive)


_SCAN_DOC = (
    "{} along ``axis`` (default: over the flattened array, giving a 1-D result). "
    "``reverse`` scans from the end; ``inclusive=false`` shifts by one so each "
    "position excludes its own element."
)

_SCANS = {
    "cumulative_sum": (mx.cumsum, _SCAN_DOC.format("Running sum")),
    "cumulative_product": (mx.cumprod, _SCAN_DOC.format("Running product")),
    "cumulative_min": (mx.cummin, _SCAN_DOC.format("Running minimum")),
    "cumulative_max": (mx.cummax, _SCAN_DOC.format("Running maximum")),
}

register_family(_SCANS, _scan, attrs=ScanAttrs, shapeless=True)


class SortAttrs(Attrs):
    axis: Axis = -1
    """The axis to sort along."""
    descending: bool = False
    """Largest first (NaNs first) instead of smallest first (NaNs last)."""


def _order_reversed(x: mx.array) -> mx.array:
    """A key whose ascending order is the descending order of ``x``, without
    overflow: ``-x`` wraps for unsigned and minimum signed integers, ``~x`` does not."""
    if x.dtype == mx.bool_:
        return mx.logical_not(x)
    if mx.issubdtype(x.dtype, mx.integer):
        return mx.bitwise_invert(x)
    return mx.negative(x)


def _nan_aware_argsort(x: mx.array, axis: int, descending: bool) -> mx.array:
    order = mx.argsort(_order_reversed(x) if descending else x, axis=axis)
    # Move NaNs to their end with a stable sort of the NaN mask: last when
    # ascending, first when descending.
    is_nan = mx.isnan(mx.take_along_axis(x, order, axis=axis))
    partition_key = mx.logical_not(is_nan) if descending else is_nan
    partition = mx.argsort(partition_key.astype(mx.uint8), axis=axis)
    return mx.take_along_axis(order, partition, axis=axis)


# Not shapeless (nor argsort): the NaN-ordering pass broadcasts against the
# traced shape, so a trace replayed for other sizes fails.
@register_op("sort", attrs=SortAttrs)
def sort(operands, attrs):
    """Sort along ``axis`` (default: the last), ascending or ``descending``. NaNs
    go last when ascending and first when descending; equal elements keep their
    order."""
    x = operands[0]
    return mx.take_along_axis(x, _nan_aware_argsort(x, attrs.axis, attrs.descending),
                              axis=attrs.axis)


@register_op("argsort", attrs=SortAttrs)
def argsort(operands, attrs):
    """The indices that ``sort`` (same attributes) would take along ``axis``:
    NaNs last when ascending, first when descending, equal elements in their
    original order. Result is uint32."""
    return _nan_aware_argsort(operands[0], attrs.axis, attrs.descending)


class SoftmaxAttrs(Attrs):
    axes: Axes | None = None
    """The axes to normalise over; default: all."""
    precise: bool = False
    """Accumulate half-precision inputs in float32."""


@register_op("softmax", attrs=SoftmaxAttrs, shapeless=True)
def softmax(operands, attrs):
    """``exp(x - max) / sum(exp(x - max))`` over ``axes`` (default: all axes, as
    ``mx.softmax``). ``precise`` accumulates half-precision inputs in float32.
    Integer and bool inputs are converted to float32 first (as ``exp`` does),
    so their result is float32."""
    x = operands[0]
    # mx.softmax over all axes keeps an integer dtype, with results that differ
    # between compiled and eager evaluation.
    if not is_floating(x.dtype):
        x = x.astype(mx.float32)
    return mx.softmax(x, axis=attrs.axes, precise=attrs.precise)
