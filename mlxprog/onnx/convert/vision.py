"""Vision ops: Resize, the older Upsample, GridSample.

Resize is separable: each resized axis is interpolated on its own, in axis
order, as ONNX's reference does. The sample positions and weights along an
axis depend only on the sizes, scales and attributes, all known at import,
so they are computed then (NumPy): the program takes the ``n`` neighbours of
each output position (``take`` with an ``[out, n]`` index array: 1 for
nearest, 2 for linear, 4 for cubic, more with antialias) and sums them with
their weights. Every mode, coordinate transformation, nearest mode,
antialias, exclude_outside, keep_aspect_ratio_policy, axes and
tf_crop_and_resize's extrapolation are covered; ``roi``, ``scales`` and
``sizes`` must be known at import, and so must the resized axes' sizes.

A channels-last input whose batch and channel axes are not resized is
resized as it is held (the result stays channels-last).

Where ONNX's reference evaluator and onnxruntime differ, this follows the
reference: ``align_corners`` with a scale whose output length is fractional
divides by ``scale * length - 1`` (onnxruntime: by the integer length - 1),
and GridSample's cubic mode with border padding clamps the coordinate only
when it lies outside the border.

GridSample (any number of spatial dims, sizes known at import) computes
the sample positions in the program (the grid is a run-time input) and reads
each tap with ``take_along_axis`` on the flattened input.
"""

from __future__ import annotations

import math

import numpy as np

from ..context import ChannelsLast, Context
from ..registry import converter

_COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                     "align_corners", "asymmetric", "tf_crop_and_resize")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


# -- the weights along one axis (NumPy, at import) ------------------------------------------

def _nearest(mode: str):
    def coeffs(ratio: float, scale: float) -> np.ndarray:
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        if mode == "round_prefer_floor":
            return np.array([ratio <= 0.5, ratio > 0.5], np.float64)
        if mode == "round_prefer_ceil":
            return np.array([ratio < 0.5, ratio >= 0.5], np.float64)
        return np.array([1.0, 0.0]) if mode == "floor" else np.array([0.0, 1.0])
    return coeffs


def _linear(antialias: bool):
    def coeffs(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return np.array([1 - ratio, ratio])
        scale = min(scale, 1.0)
        start = int(np.floor(-1 / scale) + 1)
        args = (np.arange(start, start + 2 - 2 * start) - ratio) * scale
        c = np.clip(1 - np.abs(args), 0, 1)
        return c / c.sum()
    return coeffs


def _cubic(a: float, antialias: bool):
    def kernel(x: float) -> float:
        x = abs(x)
        if x <= 1:
            return (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1
        if x < 2:
            return a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a
        return 0.0

    def coeffs(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return np.array([kernel(ratio + 1), kernel(ratio), kernel(1 - ratio),
                             kernel(2 - ratio)])
        scale = min(scale, 1.0)
        start = int(np.floor(-2 / scale) + 1)
        c = np.array([kernel(scale * (i - ratio)) for i in range(start, 2 - start)])
        return c / c.sum()
    return coeffs


def _source_coords(mode: str, out: int, size: int, scale: float, roi) -> tuple:
    """Each output position's coordinate in the input (and, for
    tf_crop_and_resize, which of them fall outside it)."""
    y = np.arange(out, dtype=np.float64)
    width = scale * size
    outside = None
    if mode == "align_corners":
        x = np.zeros(out) if width == 1 else y * (size - 1) / (width - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        lo, hi = roi
        x = (np.full(out, (hi - lo) * (size - 1) / 2) if width == 1
             else y * (hi - lo) * (size - 1) / (width - 1))
        x = x + lo * (size - 1)
        outside = (x < 0) | (x > size - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    else:  # half_pixel_symmetric
        offset = size / 2 * (1 - out / width)
        x = offset + (y + 0.5) / scale - 0.5
    return x, outside


def axis_weights(size: int, out: int, scale: float, coeffs, mode: str, roi=None,
                 exclude_outside: bool = False):
    """``(indices [out, n], weights [out, n], outside [out] or None)`` of one
    axis resized from ``size`` to ``out``."""
    x, outside = _source_coords(mode, out, size, scale, roi)
    floor = np.floor(x).astype(np.int64)
    ratios = np.where(x == floor, 1.0, x - floor)
    weights = np.stack([np.asarray(coeffs(float(r), scale), np.float64) for r in ratios])
    n = weights.shape[1]
    pad = int(np.ceil(n / 2))
    padded = x + pad
    p = np.floor(padded).astype(np.int64)
    frac = padded - p
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        base = -((n - 1) // 2)
        offset = np.where(frac <= 0.5, base, base + 1)
    idx = (p + offset)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        weights = np.where((idx < 0) | (idx >= size), 0.0, weights)
        total = weights.sum(axis=-1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    idx = np.clip(idx, 0, size - 1)
    return idx, weights, outside


def _const(ctx: Context, what: str, array: np.ndarray):
    """An array computed at import as a program value (a capture when large)."""
    return ctx.scope.importer.materialize(f"{ctx.node.output[0]}.{what}",
                                          np.ascontiguousarray(array), ctx.scope)


# -- the converter --------------------------------------------------------------------------

def _resize(ctx: Context, mode: str, coord: str, nearest_mode: str, scales, sizes, roi,
            axes, *, cubic_a=-0.75, antialias=False, exclude_outside=False,
            extrapolation=0.0, policy="stretch") -> list:
    b = ctx.b
    shape = list(ctx.shape(0))
    rank = len(shape)
    axes = list(range(rank)) if axes is None else [a + rank if a < 0 else a for a in axes]
    if sizes is not None:
        if len(sizes) != len(axes):
            raise ctx.fail(f"sizes needs one entry per resized axis ({len(axes)})")
    elif scales is None:
        raise ctx.fail("one of scales and sizes is required")
    elif len(scales) != len(axes):
        raise ctx.fail(f"scales needs one entry per resized axis ({len(axes)})")
    for a in axes:
        if not isinstance(shape[a], int):
            raise ctx.fail(f"axis {a} is resized, so its size must be known at import; "
                           f"found {shape}")
    in_sizes = [shape[a] for a in axes]
    if sizes is not None:
        factors = [s / i for s, i in zip(sizes, in_sizes)]
        out_sizes = list(sizes)
        if policy != "stretch":
            scale = min(factors) if policy == "not_larger" else max(factors)
            factors = [scale] * len(axes)
            out_sizes = [int(scale * i + 0.5) for i in in_sizes]
    else:
        factors = [float(s) for s in scales]
        out_sizes = [int(v) for v in (np.asarray(scales) * np.array(in_sizes))]
    if roi is not None and np.asarray(roi).size:
        roi = np.asarray(roi, np.float64).reshape(-1)
        if roi.size == 2 * rank and len(axes) != rank:
            roi = np.concatenate([roi[axes], roi[[rank + a for a in axes]]])
        if roi.size != 2 * len(axes):
            raise ctx.fail(f"roi needs {2 * len(axes)} entries; found {roi.size}")
    else:
        roi = None
    if mode == "nearest":
        coeffs = _nearest(nearest_mode)
    elif mode == "linear":
        coeffs = _linear(antialias)
    else:
        coeffs = _cubic(cubic_a, antialias)

    dtype = ctx.dtype(0)
    floating = np.issubdtype(dtype, np.floating)
    resized = [(a, i, o, f, None if roi is None else (roi[k], roi[len(axes) + k]))
               for k, (a, i, o, f) in enumerate(zip(axes, in_sizes, out_sizes, factors))]
    resized = [r for r in resized
               if not (math.isclose(r[3], 1.0) and r[1] == r[2]
                       and (r[4] is None or (math.isclose(r[4][0], 0.0)
                                             and math.isclose(r[4][1], 1.0))))]
    entry = ctx.scope.lookup(ctx.node.input[0])
    cl = (isinstance(entry, ChannelsLast) and rank >= 3
          and all(a >= 2 for a, *_ in resized))
    x = ctx.input_channels_last(0) if cl else ctx.input(0)
    physical = (lambda a: a if a == 0 else (rank - 1 if a == 1 else a - 1)) if cl else (lambda a: a)
    dt = "bool" if dtype == np.bool_ else np.dtype(dtype).name
    for axis, size, out, factor, axis_roi in resized:
        if out <= 0:
            raise ctx.fail(f"axis {axis} would be resized to {out} elements")
        idx, weights, outside = axis_weights(size, out, factor, coeffs, coord, axis_roi,
                                             exclude_outside)
        p = physical(axis)
        tail = [1] * (rank - 1 - p)
        onehot = np.all((weights == 0) | (weights == 1), axis=1) & (weights.sum(axis=1) == 1)
        if np.all(onehot):  # nearest: one element per position
            pick = idx[np.arange(out), np.argmax(weights, axis=1)]
            x = b.take(x, _const(ctx, f"resize{axis}.index", pick.astype(np.int32)), axis=p)
        else:
            if not floating:
                raise ctx.fail(f"mode={mode!r} is supported for floating inputs only "
                               f"(found {np.dtype(dtype).name})")
            taken = b.take(x, _const(ctx, f"resize{axis}.index", idx.astype(np.int32)), axis=p)
            w = _const(ctx, f"resize{axis}.weight", weights.astype(dtype).reshape([out, -1, *tail]))
            x = b.sum(taken * w, axes=[p + 1])
        if outside is not None and outside.any():
            mask = _const(ctx, f"resize{axis}.outside", outside.reshape([out, *tail]))
            x = b.select(mask, b.constant(float(extrapolation), dt), x)
    return [ChannelsLast(x) if cl else x]


@converter("Resize")
def resize(ctx: Context) -> list:
    """Resize (opset 11 and later: X, roi, scales, sizes)."""
    if ctx.num_inputs >= 4 and ctx.has_input(3):
        sizes, scales = ctx.static(3, "sizes"), None
    else:
        sizes = None
        scales = ctx.require_constant(2, "scales") if ctx.has_input(2) else None
        if scales is not None and scales.size == 0:
            raise ctx.fail("scales is empty and sizes is not given")
        scales = None if scales is None else np.asarray(scales).reshape(-1)
    roi = ctx.require_constant(1, "roi") if ctx.has_input(1) else None
    coord = ctx.choice("coordinate_transformation_mode", _COORDINATE_MODES, "half_pixel")
    if coord == "tf_crop_and_resize" and roi is None:
        raise ctx.fail("coordinate_transformation_mode=tf_crop_and_resize needs roi")
    if coord != "tf_crop_and_resize":
        roi = None
    axes = ctx.attr("axes", None)
    return _resize(
        ctx, ctx.choice("mode", ("nearest", "linear", "cubic"), "nearest"), coord,
        ctx.choice("nearest_mode", _NEAREST_MODES, "round_prefer_floor"), scales, sizes, roi,
        None if axes is None else [int(a) for a in axes],
        cubic_a=float(ctx.attr("cubic_coeff_a", -0.75)),
        antialias=bool(ctx.attr("antialias", 0)),
        exclude_outside=bool(ctx.attr("exclude_outside", 0)),
        extrapolation=float(ctx.attr("extrapolation_value", 0.0)),
        policy=ctx.choice("keep_aspect_ratio_policy", ("stretch", "not_larger", "not_smaller"),
                          "stretch"))


@converter("Upsample")
def upsample(ctx: Context) -> list:
    """The deprecated Upsample: Resize with asymmetric coordinates (nearest:
    floor) by ``scales`` (an input, or the attribute of opset 7)."""
    if ctx.has_input(1):
        scales = np.asarray(ctx.require_constant(1, "scales")).reshape(-1)
    else:
        scales = np.asarray(ctx.attr("scales"), np.float32)
    mode = ctx.choice("mode", ("nearest", "linear", "bilinear"), "nearest")
    mode = "linear" if mode == "bilinear" else mode
    return _resize(ctx, mode, "asymmetric", "floor", scales, None, None, None)


# -- GridSample ---------------------------------------------------------------------------------

def _cubic_weights(t, b, c):
    """Keys' cubic convolution weights (a = -0.75) of the taps at -1, 0, 1, 2 for
    a fractional offset ``t`` in [0, 1)."""
    a = -0.75

    def near(v):  # |v| <= 1
        return ((c(a + 2) * v - c(a + 3)) * v) * v + c(1)

    def far(v):  # 1 < |v| < 2
        return ((c(a) * v - c(5 * a)) * v + c(8 * a)) * v - c(4 * a)

    one = c(1)
    return [far(t + one), near(t), near(one - t), far(c(2) - t)]


@converter("GridSample")
def grid_sample(ctx: Context) -> list:
    """Samples ``X [N, C, *spatial]`` at ``grid [N, *out, nd]`` (normalized
    coordinates, the last dim in x, y, ... order): modes nearest, linear
    (bilinear) and cubic (bicubic); padding zeros, border and reflection;
    align_corners. Every tap of every output position is a ``take_along_axis``
    of the flattened input."""
    b = ctx.b
    mode = ctx.choice("mode", ("linear", "bilinear", "nearest", "cubic", "bicubic"), "linear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    padding = ctx.choice("padding_mode", ("zeros", "border", "reflection"), "zeros")
    align = bool(ctx.attr("align_corners", 0))
    xshape, gshape = list(ctx.shape(0)), list(ctx.shape(1))
    nd = len(xshape) - 2
    sizes = xshape[2:]
    out = gshape[1:-1]
    if nd < 1 or gshape[-1] != nd or len(out) != nd:
        raise ctx.fail(f"grid must be [N, *out, {nd}] for X of shape {xshape}; found {gshape}")
    if not all(isinstance(d, int) for d in [*sizes, *out]):
        raise ctx.fail("the spatial dims of X and grid must be known at import")
    dtype = np.dtype(ctx.dtype(0))
    if not np.issubdtype(dtype, np.floating):
        raise ctx.fail("X must be floating")
    n_, c_ = xshape[0], xshape[1]
    q = int(np.prod(out))
    x = b.reshape(ctx.input(0), shape=[n_, c_, -1])  # [N, C, P]
    grid = b.reshape(ctx.input(1), shape=[n_, q, nd])
    if np.dtype(ctx.dtype(1)) != dtype:
        grid = b.astype(grid, dtype=dtype.name)

    def c(v):
        return b.constant(float(v), dtype.name)

    def reflect(v, lo, hi):
        span = hi - lo
        below, above = b.less(v, c(lo)), b.greater(v, c(hi))
        dx = b.select(below, c(lo) - v, v - c(hi))
        k = b.floor(dx / c(span))
        r = dx - k * c(span)
        even = b.equal(b.remainder(k, c(2)), c(0))
        low_side = b.select(even, c(lo) + r, c(hi) - r)
        high_side = b.select(even, c(hi) - r, c(lo) + r)
        return b.select(below, low_side, b.select(above, high_side, v))

    coords = []
    parts = b.split(grid, indices_or_sections=nd, axis=-1) if nd > 1 else [grid]
    for i, size in enumerate(sizes):
        g = b.squeeze(parts[nd - 1 - i], axes=[-1])  # [N, Q]
        v = ((g + c(1)) * c(0.5)) * c(size - 1) if align else ((g + c(1)) * c(size) - c(1)) * c(0.5)
        if mode == "nearest":
            v = b.round(v)
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if padding == "border":
            outside = b.logical_or(b.less(v, c(lo)), b.greater(v, c(hi)))
            v = b.select(outside, b.clip(v, c(0), c(size - 1)), v)
        elif padding == "reflection":
            v = reflect(v, lo, hi)
        coords.append((v, lo, hi))

    def fetch_index(idx, size, lo, hi):
        """A tap's (float, integral) index: its int32 index and, for zeros, validity."""
        valid = None
        if padding == "zeros":
            valid = b.logical_and(b.greater_equal(idx, c(0)), b.less_equal(idx, c(size - 1)))
        elif padding == "border":
            idx = b.clip(idx, c(0), c(size - 1))
        else:
            idx = reflect(idx, lo, hi)
        idx = b.clip(idx, c(0), c(size - 1))
        return b.astype(idx, dtype="int32"), valid

    taps_per_dim = []
    for i, (v, lo, hi) in enumerate(coords):
        size = sizes[i]
        if mode == "nearest":
            taps = [(v, None)]
        else:
            base = b.floor(v)
            t = v - base
            if mode == "linear":
                offsets, weights = [0, 1], [c(1) - t, t]
            else:
                offsets, weights = [-1, 0, 1, 2], _cubic_weights(t, b, c)
            taps = [(base + c(o) if o else base, w) for o, w in zip(offsets, weights)]
        dim_taps = []
        for idx, w in taps:
            ii, valid = fetch_index(idx, size, lo, hi)
            if valid is not None:
                vm = b.astype(valid, dtype=dtype.name)
                w = vm if w is None else w * vm
            dim_taps.append((ii, w))
        taps_per_dim.append(dim_taps)

    strides = [int(np.prod(sizes[i + 1:])) for i in range(nd)]
    total = None
    for combo in np.ndindex(*[len(t) for t in taps_per_dim]):
        flat, weight = None, None
        for i, k in enumerate(combo):
            ii, w = taps_per_dim[i][k]
            term = ii * b.constant(strides[i], "int32") if strides[i] != 1 else ii
            flat = term if flat is None else flat + term
            if w is not None:
                weight = w if weight is None else weight * w
        picked = b.take_along_axis(x, b.expand_dims(flat, axes=[1]), axis=2)  # [N, C, Q]
        if weight is not None:
            picked = picked * b.expand_dims(weight, axes=[1])
        total = picked if total is None else total + picked
    return [b.reshape(total, shape=[n_, c_, *out])]
