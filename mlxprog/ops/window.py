"""Window ops (XLA's ``reduce_window`` and ``select_and_scatter``): sliding-window
sums, products, maxima and minima, and the max/min scatters that pooling
gradients use.

Windows are given per axis of operand 0 (every axis, batch and channel axes
included; a window of 1 with stride 1 leaves an axis alone): ``window_dimensions``,
``window_strides`` (default 1), ``padding`` as ``[low, high]`` per axis (default
none) and, for the reductions, ``window_dilations`` (default 1). An axis of size
``d`` padded to ``p = d + low + high``, with a window of ``w`` elements dilated
by ``r`` (spanning ``(w - 1) * r + 1``) and stride ``s``, has
``(p - (w - 1) * r - 1) // s + 1`` windows; the window must fit in ``p``.

With native kernels on (:mod:`mlxprog.native`), float32 ``window_sum``,
``window_product``, ``window_max`` and ``window_min`` run one CPU kernel
(max pooling of channels-last images reduces whole channel vectors) instead
of a padded copy, a strided view and an MLX reduction.
"""

from __future__ import annotations

import math

import mlx.core as mx
from ..arrays import AVal, is_floating
from ..native import kernels as native
from .attrs import Attrs, PositiveSize, Size
from .registry import register_family, register_op

Padding = tuple[Size, Size]
"""``[low, high]`` padding of one axis."""


class WindowAttrs(Attrs):
    """The window attributes every window op takes (those of the scatters)."""

    window_dimensions: list[PositiveSize]
    """Window size per axis of operand 0."""
    window_strides: list[PositiveSize] | None = None
    """Step between windows per axis (default 1)."""
    padding: list[Padding] | None = None
    """``[low, high]`` per axis (default none)."""

    @property
    def strides(self) -> list[int]:
        """``window_strides`` with its default filled in."""
        return self.window_strides or [1] * len(self.window_dimensions)

    @property
    def pads(self) -> list[tuple[int, int]]:
        """``padding`` with its default filled in."""
        return self.padding or [(0, 0)] * len(self.window_dimensions)

    @property
    def dilations(self) -> list[int]:
        """Spacing between window elements per axis."""
        return [1] * len(self.window_dimensions)

    def padded_shape(self, shape: tuple[int, ...]) -> list[int]:
        """The shape of an operand of ``shape`` after padding."""
        return [d + lo + hi for d, (lo, hi) in zip(shape, self.pads)]

    def spans(self) -> list[int]:
        """How many elements of the padded operand one window covers, per axis."""
        return [(w - 1) * r + 1 for w, r in zip(self.window_dimensions, self.dilations)]

    def counts(self, padded: list[int]) -> list[int]:
        """The number of windows per axis of a padded operand (the result shape)."""
        return [(p - span) // s + 1 for p, span, s in zip(padded, self.spans(), self.strides)]


def _check_windows(avals: list[AVal], attrs: WindowAttrs) -> None:
    """One attribute entry per axis of operand 0, and windows that fit in the
    padded operand."""
    shape = avals[0].shape
    for name in type(attrs).model_fields:
        value = getattr(attrs, name)
        if value is not None and len(value) != len(shape):
            raise ValueError(
                f"{name} needs one entry per axis of operand 0 (rank {len(shape)}); "
                f"found {len(value)}"
            )
    for axis, (p, span) in enumerate(zip(attrs.padded_shape(shape), attrs.spans())):
        if span > p:
            raise ValueError(
                f"axis {axis}: the window spans {span} element(s) but the padded operand "
                f"has {p}"
            )


class WindowReduceAttrs(WindowAttrs):
    """The attributes of the window reductions: dilations too."""

    window_dilations: list[PositiveSize] | None = None
    """Spacing between window elements per axis (default 1: contiguous)."""

    @property
    def dilations(self) -> list[int]:
        """``window_dilations`` with its default filled in."""
        return self.window_dilations or [1] * len(self.window_dimensions)


def _extreme(dtype: mx.Dtype, highest: bool) -> mx.array:
    """The largest (or smallest) value of ``dtype``; infinities for floats."""
    if dtype == mx.bool_:
        return mx.array(highest)
    if is_floating(dtype):
        return mx.array(float("inf") if highest else float("-inf"), dtype=dtype)
    info = mx.iinfo(dtype)
    return mx.array(info.max if highest else info.min, dtype=dtype)


def _windows(x: mx.array, attrs: WindowAttrs) -> mx.array:
    """A strided view of ``x`` (already padded) of shape
    ``[windows per axis..., window elements per axis...]``."""
    # as_strided addresses x's row-major buffer, so x must be row contiguous: an
    # operand that is a view (a reversed, strided or transposed slice) is copied.
    x = mx.contiguous(x)
    element = [1] * x.ndim  # row-major element strides
    for axis in range(x.ndim - 2, -1, -1):
        element[axis] = element[axis + 1] * x.shape[axis + 1]
    return mx.as_strided(
        x,
        shape=[*attrs.counts(list(x.shape)), *attrs.window_dimensions],
        strides=[
            *(e * s for e, s in zip(element, attrs.strides)),
            *(e * r for e, r in zip(element, attrs.dilations)),
        ],
    )


def _pad(x: mx.array, attrs: WindowAttrs, fill: mx.array) -> mx.array:
    """``x`` padded by ``attrs.pads`` with ``fill`` (``x`` itself without padding)."""
    if any(lo or hi for lo, hi in attrs.pads):
        return mx.pad(x, attrs.pads, constant_values=fill)
    return x


# The value each reduction pads with: the one that leaves a window's result unchanged.
_IDENTITY = {
    mx.sum: lambda dtype: mx.array(0, dtype=dtype),
    mx.prod: lambda dtype: mx.array(1, dtype=dtype),
    mx.max: lambda dtype: _extreme(dtype, highest=False),
    mx.min: lambda dtype: _extreme(dtype, highest=True),
}


# The native kernel's name for each reduction.
_NATIVE_REDUCTION = {mx.sum: "sum", mx.prod: "product", mx.max: "max", mx.min: "min"}


def window_reduce(reduce, operands, attrs: WindowReduceAttrs, context) -> mx.array:
    """Reduce each window of operand 0 with ``reduce`` (an ``mx`` reduction)."""
    x = operands[0]
    kind = _NATIVE_REDUCTION[reduce]
    out = native.window_reduce(context.native, x, reduction=kind,
                               window=attrs.window_dimensions, strides=attrs.strides,
                               dilations=attrs.dilations, padding=attrs.pads,
                               op="window_" + kind)
    if out is not None:
        return out
    windows = _windows(_pad(x, attrs, _IDENTITY[reduce](x.dtype)), attrs)
    return reduce(windows, axis=list(range(x.ndim, 2 * x.ndim)))


register_family(
    {
        "window_sum": (
            mx.sum,
            "Sum over each window; padding adds 0. The dtype follows ``mx.sum`` (small "
            "integer and bool inputs sum in a wider integer type).",
        ),
        "window_product": (
            mx.prod,
            "Product over each window; padding multiplies by 1. The dtype follows "
            "``mx.prod``.",
        ),
        "window_max": (
            mx.max,
            "Maximum over each window; padding is -inf (the dtype's minimum for integers). "
            "NaN propagates.",
        ),
        "window_min": (
            mx.min,
            "Minimum over each window; padding is +inf (the dtype's maximum for integers). "
            "NaN propagates.",
        ),
    },
    window_reduce, attrs=WindowReduceAttrs, check=_check_windows, context=True,
    native_coverage=lambda avals, attrs: native.covers_window_reduce(avals[0]),
)


def _check_window_scatter(avals: list[AVal], attrs: WindowAttrs) -> None:
    """The windows fit, ``source`` has one element per window and ``init`` is
    a scalar."""
    _check_windows(avals, attrs)
    operand, source, init = avals
    windows = attrs.counts(attrs.padded_shape(operand.shape))
    if list(source.shape) != windows:
        raise ValueError(
            f"source (operand 1) must have one element per window, shape {windows}; "
            f"found {list(source.shape)}"
        )
    if init.shape != ():
        raise ValueError(f"init value (operand 2) must be a scalar; found {list(init.shape)}")


def _first_best(windows: mx.array, real: mx.array, select_max: bool) -> mx.array:
    """The position (in a window's flattened elements, last axis of ``windows``)
    of each window's first maximum (or minimum) among its real elements.

    Padding is excluded by ``real``, not by its value: a real element equal to
    the padding value (-inf, +inf, an integer extreme) must still win. A NaN is
    the best value, as in ``mx.argmax``. A window of padding only gets position 0,
    a padding position whose scatter is cut off."""
    identity = _extreme(windows.dtype, highest=not select_max)
    masked = mx.where(real, windows, identity)
    best = (mx.max if select_max else mx.min)(masked, axis=-1, keepdims=True)
    hit = masked == best
    if is_floating(windows.dtype):
        hit = hit | mx.isnan(masked)  # best is NaN exactly when some real element is
    return mx.argmax(real & hit, axis=-1, keepdims=True)


def _window_scatter(operands, attrs: WindowAttrs, select_max: bool) -> mx.array:
    """Select-and-scatter: ``source`` added at each window's max (or min)."""
    x, source, init = operands
    padded_shape = attrs.padded_shape(x.shape)
    positions = mx.arange(math.prod(padded_shape)).reshape(padded_shape)
    real = _pad(mx.ones(x.shape, mx.bool_), attrs, mx.array(False))
    flat = [*attrs.counts(padded_shape), -1]

    def windows_of(array: mx.array) -> mx.array:
        return _windows(array, attrs).reshape(flat)

    padded = _pad(x, attrs, mx.array(0, x.dtype))  # any value: `real` masks it out
    chosen = _first_best(windows_of(padded), windows_of(real), select_max)
    targets = mx.take_along_axis(windows_of(positions), chosen, axis=-1)
    init = init.astype(x.dtype)
    out = mx.full((positions.size,), init).at[targets.reshape(-1)].add(source.reshape(-1))
    out = out.reshape(padded_shape)
    return out[tuple(slice(lo, lo + d) for (lo, _), d in zip(attrs.pads, x.shape))]


@register_op("window_scatter_max", attrs=WindowAttrs, operands=3, check=_check_window_scatter)
def window_scatter_max(operands, attrs):
    """Select-and-scatter with max (the gradient of max pooling). Operands:
    ``input``, ``source`` (one value per window, i.e. the shape ``window_max``
    gives with the same attributes) and a scalar ``init``. Each window's source
    value is added at the position of the window's maximum (the first one on
    ties) in an array of ``init``. Padding never wins over a real element, as in
    XLA. Result: the input's shape and dtype (``source`` and ``init`` are
    converted to it)."""
    return _window_scatter(operands, attrs, select_max=True)


@register_op("window_scatter_min", attrs=WindowAttrs, operands=3, check=_check_window_scatter)
def window_scatter_min(operands, attrs):
    """Select-and-scatter with min: as ``window_scatter_max``, at each window's
    minimum (the first one on ties)."""
    return _window_scatter(operands, attrs, select_max=False)
