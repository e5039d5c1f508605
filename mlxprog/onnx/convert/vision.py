"""Vision ops: Resize, the older Upsample, GridSample, AffineGrid, Col2Im,
RoiAlign.

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

from ...arrays import name_of
from ..context import ChannelsLast, Context
from ..dtypes import dtype_name, is_float_dtype
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
    return ctx.known_value(f"{ctx.node.output[0]}.{what}", np.ascontiguousarray(array))


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
    floating = is_float_dtype(dtype)
    resized = [(a, i, o, f, None if roi is None else (roi[k], roi[len(axes) + k]))
               for k, (a, i, o, f) in enumerate(zip(axes, in_sizes, out_sizes, factors))]
    resized = [r for r in resized
               if not (math.isclose(r[3], 1.0) and r[1] == r[2]
                       and (r[4] is None or (math.isclose(r[4][0], 0.0)
                                             and math.isclose(r[4][1], 1.0))))]
    cl = ctx.is_channels_last(0) and rank >= 3 and all(a >= 2 for a, *_ in resized)
    x = ctx.input_channels_last(0) if cl else ctx.input(0)
    physical = (lambda a: a if a == 0 else (rank - 1 if a == 1 else a - 1)) if cl else (lambda a: a)
    dt = dtype_name(dtype)
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
    if not is_float_dtype(dtype):
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


# -- AffineGrid, Col2Im ----------------------------------------------------------------------


def _grid_axis(size: int, align_corners: int) -> np.ndarray:
    """Normalized sample positions along one axis of ``size``: the pixels'
    centres in ``(-1, 1)``, or with ``align_corners`` from -1 to 1 (the
    reference's: a single pixel sits at -1)."""
    if align_corners:
        return np.linspace(-1.0, 1.0, size) if size > 1 else np.array([-1.0])
    return -1 + (2 * np.arange(size) + 1) / size


@converter("AffineGrid")
def affine_grid(ctx: Context) -> list:
    """The sampling grid of affine matrices ``theta`` (``[N, 2, 3]`` or
    ``[N, 3, 4]``) over an output of ``size`` (``[N, C, H, W]`` or
    ``[N, C, D, H, W]``, known at import): ``[N, H, W, 2]`` (x, y) or
    ``[N, D, H, W, 3]`` (x, y, z), ``theta`` times each homogeneous position."""
    align = ctx.choice("align_corners", (0, 1), 0)
    size = ctx.static(1, "size")
    spatial = size[2:]
    n = len(spatial)
    theta = list(ctx.shape(0))
    if n not in (2, 3) or theta[1:] != [n, n + 1]:
        raise ctx.fail(f"theta {theta} and size {size} must be [N, 2, 3] and 4 entries, or "
                       "[N, 3, 4] and 5 entries")
    # Homogeneous positions [x, y, (z,) 1] of every output pixel, x the last axis's.
    axes = np.meshgrid(*[_grid_axis(s, align) for s in spatial], indexing="ij")
    base = np.stack([*reversed([a.reshape(-1) for a in axes]), np.ones(int(np.prod(spatial)))])
    array = base.astype(ctx.dtype(0))
    base_value = ctx.known_value(f"{ctx.node.output[0]}.grid", array)
    b = ctx.b
    grid = b.matmul(ctx.input(0), base_value)  # [N, n, pixels]
    return [b.reshape(b.transpose(grid, axes=[0, 2, 1]), shape=[theta[0], *spatial, n])]


@converter("Col2Im")
def col2im(ctx: Context) -> list:
    """The image of columns ``[N, C * prod(block_shape), L]`` (each of the L
    sliding blocks' values, as Im2Col lays them out) summed back into
    ``[N, C, *image_shape]`` (both shapes known at import), with
    ``dilations``, ``pads`` and ``strides``: a scatter-add of the columns
    into the flattened image, positions computed at import (those in the
    padding dropped)."""
    image = ctx.static(1, "image_shape")
    block = ctx.static(2, "block_shape")
    n = len(image)
    dilations = list(ctx.attr("dilations", [1] * n))
    strides = list(ctx.attr("strides", [1] * n))
    pads = list(ctx.attr("pads", [0] * 2 * n))
    if len(block) != n or len(dilations) != n or len(strides) != n or len(pads) != 2 * n:
        raise ctx.fail(f"block_shape {block}, dilations {dilations}, strides {strides} and "
                       f"pads {pads} must have one entry (pads: two) per axis of image_shape "
                       f"{image}")
    shape = list(ctx.shape(0))
    kernel = int(np.prod(block))
    blocks = [(image[d] + pads[d] + pads[d + n] - dilations[d] * (block[d] - 1) - 1)
              // strides[d] + 1 for d in range(n)]
    if (len(shape) != 3 or not all(isinstance(s, int) for s in shape) or shape[1] % kernel
            or shape[2] != int(np.prod(blocks)) or min(blocks) < 1):
        raise ctx.fail(f"the input {shape} must be [N, C * {kernel}, {int(np.prod(blocks))}] "
                       f"for image_shape {image} and block_shape {block}")
    # Each (kernel offset, block) pair's position in the image, per axis.
    offsets = np.indices(block).reshape(n, -1)  # [n, kernel]
    starts = np.indices(blocks).reshape(n, -1)  # [n, L]
    position = [starts[d][None, :] * strides[d] - pads[d] + offsets[d][:, None] * dilations[d]
                for d in range(n)]  # [kernel, L] each
    inside = np.all([(p >= 0) & (p < image[d]) for d, p in enumerate(position)], axis=0)
    flat = np.ravel_multi_index([np.clip(p, 0, image[d] - 1) for d, p in enumerate(position)],
                                image)
    pixels = int(np.prod(image))
    flat = np.where(inside, flat, pixels)  # out of range: the scatter drops it
    b = ctx.b
    batch, channels = shape[0], shape[1] // kernel
    cols = b.reshape(ctx.input(0), shape=[batch, channels, kernel * shape[2]])
    cols = b.transpose(cols, axes=[2, 0, 1])  # [kernel * L, N, C]
    index = ctx.known_value(f"{ctx.node.output[0]}.positions",
                            flat.reshape(-1, 1).astype(np.int32))
    target = b.full(shape=[pixels, batch, channels], dtype=name_of(cols.dtype), value=0)
    summed = b.indexed_add(target, index, cols, axes=[0])
    return [b.reshape(b.transpose(summed, axes=[1, 2, 0]), shape=[batch, channels, *image])]


# -- RoiAlign ----------------------------------------------------------------------------------


def _roi_taps(roi: np.ndarray, height: int, width: int, out_h: int, out_w: int,
              ratio: int, scale: float, half_pixel: bool):
    """One region's bilinear taps, as ONNX's reference computes them: per
    output pixel and sample, 4 flat positions and weights
    (``[out_h * out_w, samples, 4]`` each) and the sample count."""
    offset = 0.5 if half_pixel else 0.0
    x0, y0, x1, y1 = (float(v) * scale - offset for v in roi[:4])
    roi_w, roi_h = x1 - x0, y1 - y0
    if not half_pixel:  # malformed regions are made 1x1
        roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
    bin_h, bin_w = roi_h / out_h, roi_w / out_w
    grid_h = ratio if ratio > 0 else int(np.ceil(roi_h / out_h))
    grid_w = ratio if ratio > 0 else int(np.ceil(roi_w / out_w))
    ph, pw, iy, ix = np.meshgrid(np.arange(out_h), np.arange(out_w), np.arange(grid_h),
                                 np.arange(grid_w), indexing="ij")
    y = y0 + ph * bin_h + (iy + 0.5) * bin_h / max(grid_h, 1)
    x = x0 + pw * bin_w + (ix + 0.5) * bin_w / max(grid_w, 1)
    outside = (y < -1.0) | (y > height) | (x < -1.0) | (x > width)
    y, x = np.maximum(y, 0), np.maximum(x, 0)
    y_low, x_low = np.floor(y).astype(np.int64), np.floor(x).astype(np.int64)
    y_edge, x_edge = y_low >= height - 1, x_low >= width - 1
    y_low, x_low = np.where(y_edge, height - 1, y_low), np.where(x_edge, width - 1, x_low)
    y, x = np.where(y_edge, y_low, y), np.where(x_edge, x_low, x)
    y_high, x_high = np.where(y_edge, y_low, y_low + 1), np.where(x_edge, x_low, x_low + 1)
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    positions = np.stack([y_low * width + x_low, y_low * width + x_high,
                          y_high * width + x_low, y_high * width + x_high], axis=-1)
    weights = np.stack([hy * hx, hy * lx, ly * hx, ly * lx], axis=-1)
    positions[outside], weights[outside] = 0, 0.0
    samples = grid_h * grid_w
    return (positions.reshape(out_h * out_w, samples, 4),
            weights.reshape(out_h * out_w, samples, 4), samples)


@converter("RoiAlign")
def roi_align(ctx: Context) -> list:
    """Regions ``rois`` (``[R, 4]``: x1, y1, x2, y2, known at import: with
    ``sampling_ratio=0`` their sizes decide how many samples each takes)
    of the images ``batch_indices`` of ``X`` (``[N, C, H, W]``), each pooled
    to ``output_height x output_width`` by averaging (``mode="avg"``) or
    taking the largest of (``"max"``) bilinear samples: ``[R, C, oh, ow]``.
    The taps are computed at import; the program gathers and weighs them."""
    mode = ctx.choice("mode", ("avg", "max"), "avg")
    transform = ctx.choice("coordinate_transformation_mode",
                           ("half_pixel", "output_half_pixel"), "half_pixel")
    out_h, out_w = ctx.attr("output_height", 1), ctx.attr("output_width", 1)
    ratio = ctx.attr("sampling_ratio", 0)
    scale = ctx.attr("spatial_scale", 1.0)
    if out_h < 1 or out_w < 1 or ratio < 0:
        raise ctx.fail(f"attributes output_height={out_h}, output_width={out_w} must be "
                       f"positive and sampling_ratio={ratio} not negative")
    shape = list(ctx.shape(0))
    if len(shape) != 4 or not all(isinstance(d, int) for d in shape[1:]):
        raise ctx.fail(f"X must be [N, C, H, W] with C, H and W known; its shape is {shape}")
    rois = np.asarray(ctx.require_constant(1, "rois"), np.float64)
    if rois.ndim != 2 or rois.shape[1] != 4:
        raise ctx.fail(f"rois must be [num_rois, 4]; its shape is {list(rois.shape)}")
    _, channels, height, width = shape
    taps = [_roi_taps(r, height, width, out_h, out_w, ratio, scale, transform == "half_pixel")
            for r in rois]
    most = max([t[2] for t in taps] + [1])
    count = len(rois)
    positions = np.zeros((count, out_h * out_w, most, 4), np.int32)
    weights = np.zeros((count, out_h * out_w, most, 4))
    for r, (pos, w, samples) in enumerate(taps):
        positions[r, :, :samples], weights[r, :, :samples] = pos, w
    b = ctx.b
    dtype = np.dtype(ctx.dtype(0))
    name = ctx.node.output[0]
    pos_value = ctx.known_value(f"{name}.taps", positions.reshape(count, 1, -1))
    w_value = ctx.known_value(f"{name}.weights", weights.reshape(count, 1, -1).astype(dtype))
    images = b.take(ctx.input(0), b.astype(ctx.input(2), dtype="int32"), axis=0)
    images = b.reshape(images, shape=[count, channels, height * width])
    index = b.broadcast_to(pos_value, shape=[count, channels, positions[0].size])
    values = b.multiply(b.take_along_axis(images, index, axis=2), w_value)
    values = b.reshape(values, shape=[count, channels, out_h * out_w, most, 4])
    if mode == "avg":
        counts = np.array([max(t[2], 1) for t in taps], dtype).reshape(count, 1, 1)
        pooled = b.divide(b.sum(values, axes=[3, 4]),
                          ctx.known_value(f"{name}.counts", counts))
    else:
        # Padding samples (beyond a region's own count) must not win the max;
        # a region without samples gives 0 (its one zero-weight padding sample).
        real = np.arange(most)[None, :] < np.array([max(t[2], 1) for t in taps])[:, None]
        mask = ctx.known_value(f"{name}.real", real.reshape(count, 1, 1, most))
        best = b.reduce_max(values, axes=[4])
        pooled = b.reduce_max(b.select(mask, best, ctx.scalar(-np.inf, best)), axes=[3])
    return [b.reshape(pooled, shape=[count, channels, out_h, out_w])]
