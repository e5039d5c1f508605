"""Neural-network layers: Conv, ConvTranspose, the pools (MaxPool,
AveragePool, LpPool, GlobalAveragePool, GlobalMaxPool, GlobalLpPool,
MaxUnpool), the
normalizations (BatchNormalization, InstanceNormalization,
LayerNormalization, GroupNormalization, LpNormalization,
MeanVarianceNormalization, LRN) and Dropout (inference).

Layout: MLX's convolutions are channels-last, so Conv and ConvTranspose
return :class:`~..context.ChannelsLast` results. The layers that work along
the channel axis or the spatial axes alone (BatchNormalization, the pools,
LRN, InstanceNormalization, Dropout) *follow* their input's layout: a
channels-last input gives a channels-last result, an ONNX-layout input an
ONNX-layout result, so a chain Conv -> BatchNormalization -> MaxPool -> Conv
has no transpose between its layers and a pool after a Relu needs none either.

MaxPool's optional Indices output is computed from the window taps as
strided slices (ONNX layout). Spatial sizes must be known at import (pads, ceil_mode and the average
pool's divisor are computed then); the batch dim may be symbolic.
"""

from __future__ import annotations

import math

import numpy as np

from ..context import ChannelsLast, Context
from ..registry import converter


# -- helpers -------------------------------------------------------------------------------

def _is_channels_last(ctx: Context, i: int) -> bool:
    """Whether input ``i`` is held channels-last."""
    try:
        return isinstance(ctx.scope.lookup(ctx.node.input[i]), ChannelsLast)
    except KeyError:
        return False


def _input_following(ctx: Context, i: int = 0):
    """Input ``i`` in the layout it is held in: ``(value, channels_last)``."""
    if _is_channels_last(ctx, i) and len(ctx.shape(i)) >= 3:
        return ctx.input_channels_last(i), True
    return ctx.input(i), False


def _wrap(value, channels_last: bool):
    return ChannelsLast(value) if channels_last else value


def _spatial_sizes(ctx: Context, i: int, what: str) -> list[int]:
    """Input ``i``'s spatial sizes (ONNX layout ``[N, C, *spatial]``), which
    must be known at import."""
    shape = ctx.shape(i)
    if len(shape) < 3:
        raise ctx.fail(f"{what} must be [N, C, *spatial] with at least one spatial dim; "
                       f"found rank {len(shape)}")
    spatial = shape[2:]
    if not all(isinstance(d, int) for d in spatial):
        raise ctx.fail(f"the spatial dims of {what} must be known at import; found {list(shape)}")
    return list(spatial)


def _import_constant(ctx: Context, key: str, array: np.ndarray):
    """``array`` (computed at import) as a program value: a capture named
    ``folded.<key>`` when large, a constant when small."""
    return ctx.scope.importer.materialize(key, np.ascontiguousarray(array), ctx.scope)


def _channel_shape(rank: int, channels, channels_last: bool) -> list:
    """The shape that broadcasts a per-channel vector over a rank-``rank`` tensor."""
    if channels_last:
        return [1] * (rank - 1) + [channels]
    return [1, channels] + [1] * (rank - 2)


def _per_channel(ctx: Context, i: int, rank: int, channels_last: bool, dtype):
    """Input ``i`` (a ``[C]`` vector) shaped to broadcast over the data."""
    const = ctx.constant(i)
    if const is not None and const.dtype != object:
        arr = np.asarray(const).astype(dtype).reshape(
            _channel_shape(rank, const.size, channels_last))
        return _import_constant(ctx, f"{ctx.node.input[i]}.{'nhwc' if channels_last else 'nchw'}",
                                arr)
    v = ctx.input(i)
    return ctx.b.reshape(v, shape=_channel_shape(rank, -1, channels_last))


def _auto_pads(ctx: Context, sizes, kernel, strides, dilations) -> list[tuple[int, int]]:
    """``[lo, hi]`` per spatial dim from ``auto_pad`` / ``pads`` (Conv's and the pools')."""
    n = len(kernel)
    auto_pad = ctx.choice("auto_pad", ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"), "NOTSET")
    if auto_pad == "NOTSET":
        pads = list(ctx.attr("pads", [0] * (2 * n)))
        if len(pads) != 2 * n:
            raise ctx.fail(f"pads needs {2 * n} entries (begin and end per spatial dim); "
                           f"found {len(pads)}")
        return [(int(pads[d]), int(pads[d + n])) for d in range(n)]
    if auto_pad == "VALID":
        return [(0, 0)] * n
    result = []
    for size, k, s, r in zip(sizes, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * r + 1 - size)
        small, big = total // 2, total - total // 2
        result.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
    return result


def _ints(ctx: Context, name: str, n: int, default: int) -> list[int]:
    value = list(ctx.attr(name, [default] * n))
    if len(value) != n:
        raise ctx.fail(f"{name} needs {n} entries (one per spatial dim); found {len(value)}")
    return [int(v) for v in value]


def _dtype_name(dtype) -> str:
    return "bool" if np.dtype(dtype) == np.bool_ else np.dtype(dtype).name


# -- convolutions ----------------------------------------------------------------------------

def _conv_cl(ctx: Context, x, w, groups: int, spatial: int, **attrs):
    """``conv_general`` of channels-last ``x`` and ``[O, *k, I/g]`` weights;
    MLX groups only 1-d and 2-d convolutions, so 3-d groups run one by one."""
    b = ctx.b
    if groups == 1 or spatial <= 2:
        return b.conv_general(x, w, groups=groups, **attrs)
    xs = b.split(x, indices_or_sections=groups, axis=-1)
    ws = b.split(w, indices_or_sections=groups, axis=0)
    parts = [b.conv_general(xi, wi, **attrs) for xi, wi in zip(xs, ws)]
    return b.concatenate(*parts, axis=-1)


def _weight(ctx: Context, i: int, fn_np, fn_prog, key: str):
    """Weight input ``i`` rearranged for MLX: at import when it is known
    (``fn_np`` on the array), in the program otherwise (``fn_prog``)."""
    const = ctx.constant(i)
    if const is not None and const.dtype != object:
        return _import_constant(ctx, f"{ctx.node.input[i]}.{key}", fn_np(np.asarray(const)))
    return fn_prog(ctx.input(i))


def _add_bias(ctx: Context, y, i: int, rank: int):
    if ctx.has_input(i):
        y = y + _per_channel(ctx, i, rank, True, ctx.dtype(0))
    return y


@converter("Conv")
def conv(ctx: Context) -> list:
    """N-d convolution (``conv_general``, channels-last result)."""
    sizes = _spatial_sizes(ctx, 0, "the input X")
    n = len(sizes)
    wshape = ctx.shape(1)
    if len(wshape) != n + 2 or not all(isinstance(d, int) for d in wshape):
        raise ctx.fail(f"weight W must be [M, C/group, *kernel] of rank {n + 2} with static "
                       f"dims; found {list(wshape)}")
    kernel = list(ctx.attr("kernel_shape", wshape[2:]))
    if list(kernel) != list(wshape[2:]):
        raise ctx.fail(f"kernel_shape {kernel} differs from the weight's {list(wshape[2:])}")
    strides = _ints(ctx, "strides", n, 1)
    dilations = _ints(ctx, "dilations", n, 1)
    groups = int(ctx.attr("group", 1))
    pads = _auto_pads(ctx, sizes, kernel, strides, dilations)
    x = ctx.input_channels_last(0)
    rank = n + 2
    w = _weight(ctx, 1, lambda a: np.moveaxis(a, 1, -1),
                lambda v: ctx.b.transpose(v, axes=[0, *range(2, rank), 1]), "ohwi")
    y = _conv_cl(ctx, x, w, groups, n, stride=strides, padding=[list(p) for p in pads],
                 kernel_dilation=dilations)
    return [ChannelsLast(_add_bias(ctx, y, 2, rank))]


@converter("ConvTranspose")
def conv_transpose(ctx: Context) -> list:
    """Transposed convolution as a ``conv_general`` of the input dilated by
    the strides with the flipped kernel (this takes ONNX's asymmetric pads,
    output_padding and output_shape); channels-last result."""
    b = ctx.b
    sizes = _spatial_sizes(ctx, 0, "the input X")
    n = len(sizes)
    rank = n + 2
    wshape = ctx.shape(1)
    if len(wshape) != rank or not all(isinstance(d, int) for d in wshape):
        raise ctx.fail(f"weight W must be [C, M/group, *kernel] of rank {rank} with static "
                       f"dims; found {list(wshape)}")
    kernel = list(wshape[2:])
    if list(ctx.attr("kernel_shape", kernel)) != kernel:
        raise ctx.fail("kernel_shape differs from the weight's kernel")
    groups = int(ctx.attr("group", 1))
    strides = _ints(ctx, "strides", n, 1)
    dilations = _ints(ctx, "dilations", n, 1)
    out_pad = _ints(ctx, "output_padding", n, 0)
    auto_pad = ctx.choice("auto_pad", ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"), "NOTSET")
    output_shape = ctx.attr("output_shape", None)
    if output_shape is not None:
        output_shape = [int(v) for v in output_shape][-n:]
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    full = [s * (i - 1) + op + sp for s, i, op, sp in zip(strides, sizes, out_pad, spans)]
    given_pads = ctx.attr("pads", None)
    if given_pads is not None and auto_pad == "NOTSET":
        pads = [(int(given_pads[d]), int(given_pads[d + n])) for d in range(n)]
    elif auto_pad == "VALID" and output_shape is None:
        pads = [(0, 0)] * n
    elif output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = output_shape or [i * s for i, s in zip(sizes, strides)]
        pads = []
        for f, t in zip(full, target):
            total = f - t  # negative: the output grows (at the end, then the start)
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
    else:
        pads = [(0, 0)] * n

    cin = wshape[0]
    mg = wshape[1]
    cg = cin // groups

    def arrange_np(a):
        a = a.reshape(groups, cg, mg, *kernel)
        a = np.moveaxis(a, 1, -1)  # [g, Mg, *k, Cg]
        return a.reshape(groups * mg, *kernel, cg)

    def arrange_prog(v):
        v = b.reshape(v, shape=[groups, cg, mg, *kernel])
        v = b.transpose(v, axes=[0, 2, *range(3, 3 + n), 1])
        return b.reshape(v, shape=[groups * mg, *kernel, cg])

    w = _weight(ctx, 1, arrange_np, arrange_prog, f"convT.g{groups}")
    x = ctx.input_channels_last(0)
    lo = [sp - 1 - p for sp, (p, _) in zip(spans, pads)]
    hi = [sp - 1 - p + op for sp, (_, p), op in zip(spans, pads, out_pad)]
    y = _conv_cl(ctx, x, w, groups, n, stride=[1] * n,
                 padding=[[max(0, a), max(0, c)] for a, c in zip(lo, hi)],
                 kernel_dilation=dilations, input_dilation=strides, flip=True)
    if any(a < 0 or c < 0 for a, c in zip(lo, hi)):  # pads beyond the kernel: crop
        shape = ctx.scope.importer.symbolic_shape(y)
        starts = [0, *(max(0, -a) for a in lo), 0]
        lengths = [shape[0], *(f - p0 - p1 for f, (p0, p1) in zip(full, pads)), shape[-1]]
        y = b.slice(y, lengths=list(lengths), starts=starts)
    return [ChannelsLast(_add_bias(ctx, y, 2, rank))]


# -- pools -------------------------------------------------------------------------------------

def _pool_geometry(ctx: Context, has_dilations: bool = True):
    """``(sizes, kernel, strides, dilations, pads, extra, out)``: the pads
    per spatial dim, the extra end padding ceil_mode adds, the output sizes."""
    sizes = _spatial_sizes(ctx, 0, "the input X")
    n = len(sizes)
    kernel = [int(k) for k in ctx.attr("kernel_shape")]
    if len(kernel) != n:
        raise ctx.fail(f"kernel_shape needs {n} entries; found {len(kernel)}")
    strides = _ints(ctx, "strides", n, 1)
    dilations = _ints(ctx, "dilations", n, 1) if has_dilations else [1] * n
    pads = _auto_pads(ctx, sizes, kernel, strides, dilations)
    ceil_mode = bool(ctx.attr("ceil_mode", 0))
    extra, out = [], []
    for size, k, s, r, (lo, hi) in zip(sizes, kernel, strides, dilations, pads):
        span = (k - 1) * r + 1
        padded = size + lo + hi
        if padded < span:
            raise ctx.fail(f"the window ({span}) is larger than the padded input ({padded})")
        count = (padded - span) // s + 1
        if ceil_mode:
            count = -(-(padded - span) // s) + 1
            if (count - 1) * s >= size + lo:  # the last window must start inside
                count -= 1
        out.append(count)
        extra.append(max(0, (count - 1) * s + span - padded))
    return sizes, kernel, strides, dilations, pads, extra, out


def _window_attrs(kernel, strides, dilations, pads, extra, channels_last: bool) -> dict:
    spatial_pad = [[lo, hi + e] for (lo, hi), e in zip(pads, extra)]
    if channels_last:
        wrap = lambda inner, edge: [edge, *inner, edge]  # noqa: E731
    else:
        wrap = lambda inner, edge: [edge, edge, *inner]  # noqa: E731
    return dict(window_dimensions=wrap(kernel, 1), window_strides=wrap(strides, 1),
                padding=wrap(spatial_pad, [0, 0]), window_dilations=wrap(dilations, 1))


@converter("MaxPool")
def max_pool(ctx: Context) -> list:
    """``window_max`` (padding never wins); with the Indices output, the
    window taps are strided slices, their first maximum the index."""
    if ctx.wants_output(1):
        return _max_pool_with_indices(ctx)
    _, kernel, strides, dilations, pads, extra, _ = _pool_geometry(ctx)
    x, cl = _input_following(ctx)
    y = ctx.b.window_max(x, **_window_attrs(kernel, strides, dilations, pads, extra, cl))
    return [_wrap(y, cl)]


def _max_pool_with_indices(ctx: Context) -> list:
    """MaxPool's values and Indices (flat into ``[N, C, *spatial]``, row-major,
    or with the spatial dims column-major for ``storage_order=1``): each of the
    ``prod(kernel)`` taps of every window is one strided slice of the padded
    input; the first maximum over the taps (in row-major window order, as
    ONNX's reference) gives the value and, from a table computed at import,
    the index."""
    b = ctx.b
    sizes, kernel, strides, dilations, pads, extra, out = _pool_geometry(ctx)
    storage_order = int(ctx.attr("storage_order", 0))
    shape = list(ctx.shape(0))
    n = len(sizes)
    dtype = np.dtype(ctx.dtype(0))
    x = ctx.input(0)
    low = (-np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min)
    fill = b.constant(float(low) if np.issubdtype(dtype, np.floating) else int(low),
                      _dtype_name(dtype))
    padded = b.pad(x, fill, pad_width=[[0, 0], [0, 0],
                                       *([lo, hi + e] for (lo, hi), e in zip(pads, extra))])
    taps = list(np.ndindex(*kernel))
    slices = []
    for tap in taps:
        slices.append(b.slice(
            padded, lengths=[shape[0], shape[1], *((o - 1) * s + 1 for o, s in zip(out, strides))],
            starts=[0, 0, *(t * r for t, r in zip(tap, dilations))],
            strides=[1, 1, *strides]))
    stacked = b.stack(*slices, axis=-1)  # [N, C, *out, K]
    best = b.argmax(stacked, axis=-1, keepdims=True)
    values = b.squeeze(b.take_along_axis(stacked, best, axis=-1), axes=[-1])
    # the spatial flat index of every tap of every window (a padding tap never wins
    # unless a window holds nothing but -inf)
    elem = ([int(np.prod(sizes[d + 1:])) for d in range(n)] if storage_order == 0
            else [int(np.prod(sizes[:d])) for d in range(n)])
    table = np.zeros([*out, len(taps)], np.int64)
    for k, tap in enumerate(taps):
        pos = np.zeros(out, np.int64)
        for d in range(n):
            coord = np.arange(out[d]) * strides[d] + tap[d] * dilations[d] - pads[d][0]
            coord = np.clip(coord, 0, sizes[d] - 1)
            pos = pos + (coord * elem[d]).reshape([-1 if e == d else 1 for e in range(n)])
        table[..., k] = pos
    table_v = _import_constant(ctx, f"{ctx.node.output[1]}.taps", table[None, None])
    spatial = b.squeeze(b.take_along_axis(table_v, b.astype(best, dtype="int64"), axis=-1),
                        axes=[-1])
    plane = b.iota(shape=[shape[0], shape[1], *([1] * n)], dtype="int64")
    indices = spatial + plane * b.constant(int(np.prod(sizes)), "int64")
    return [values, indices]


@converter("MaxUnpool")
def max_unpool(ctx: Context) -> list:
    """Zeros with X scattered (``indexed_put``) at the flat indices I (as
    MaxPool's Indices give them) into the shape the pool geometry gives;
    ``output_shape`` (known at import) pads that with zeros at the end, as
    ONNX's reference does (onnxruntime and PyTorch read the indices in the
    output_shape's space instead)."""
    b = ctx.b
    sizes = _spatial_sizes(ctx, 0, "the input X")
    n = len(sizes)
    shape = list(ctx.shape(0))
    kernel = [int(k) for k in ctx.attr("kernel_shape")]
    strides = _ints(ctx, "strides", n, 1)
    pads = list(ctx.attr("pads", [0] * (2 * n)))
    out = [(i - 1) * s + k - pads[d] - pads[d + n]
           for d, (i, s, k) in enumerate(zip(sizes, strides, kernel))]
    final = out
    if ctx.has_input(2):
        final = ctx.static(2, "output_shape")[2:]
        if len(final) != n:
            raise ctx.fail(f"output_shape must have rank {n + 2}")
    plane = int(shape[1]) * int(np.prod(out)) if isinstance(shape[1], int) else None
    if plane is None:
        raise ctx.fail("the channels must be known at import")
    dtype = _dtype_name(ctx.dtype(0))
    idx = b.astype(ctx.input(1), dtype="int64")
    per = b.constant(plane, "int64")
    vectors = b.stack(b.quotient(idx, per), b.remainder(idx, per), axis=-1)
    target = b.full(shape=[shape[0], plane], dtype=dtype, value=0)
    y = b.indexed_put(target, vectors, ctx.input(0), axes=[0, 1])
    y = b.reshape(y, shape=[shape[0], shape[1], *out])
    if final != out:  # as ONNX's reference: indices into the inferred shape, zero-padded
        y = b.pad(y, b.constant(0, dtype),
                  pad_width=[[0, 0], [0, 0], *([0, f - o] for f, o in zip(final, out))])
    return [y]


def _pool_counts(sizes, kernel, strides, dilations, pads, out, include_pad: bool) -> np.ndarray:
    """How many elements each window averages over, per output position."""
    counts = np.ones([], np.float64)
    for size, k, s, r, (lo, hi), o in zip(sizes, kernel, strides, dilations, pads, out):
        taps = np.arange(o)[:, None] * s + np.arange(k)[None, :] * r  # padded coords
        inside = (taps < size + lo + hi) if include_pad else ((taps >= lo) & (taps < lo + size))
        counts = np.multiply.outer(counts, inside.sum(axis=1))
    return counts


@converter("AveragePool")
def average_pool(ctx: Context) -> list:
    """``window_sum`` over the count of each window (padding counted with
    count_include_pad, the extra end padding of ceil_mode never)."""
    sizes, kernel, strides, dilations, pads, extra, out = _pool_geometry(ctx)
    include = bool(ctx.attr("count_include_pad", 0))
    x, cl = _input_following(ctx)
    total = ctx.b.window_sum(x, **_window_attrs(kernel, strides, dilations, pads, extra, cl))
    counts = _pool_counts(sizes, kernel, strides, dilations, pads, out, include)
    dtype = ctx.dtype(0)
    if np.all(counts == counts.flat[0]):
        y = total * ctx.b.constant(float(1.0 / counts.flat[0]), _dtype_name(dtype))
    else:
        shape = [1, *out, 1] if cl else [1, 1, *out]
        inv = (1.0 / counts).astype(dtype).reshape(shape)
        y = total * _import_constant(ctx, f"{ctx.node.output[0]}.avgpool_scale", inv)
    return [_wrap(y, cl)]


@converter("LpPool")
def lp_pool(ctx: Context) -> list:
    """``(sum |x|^p over each window)^(1/p)``."""
    b = ctx.b
    _, kernel, strides, dilations, pads, extra, _ = _pool_geometry(ctx)
    p = float(ctx.attr("p", 2))
    x, cl = _input_following(ctx)
    dt = _dtype_name(ctx.dtype(0))
    ax = b.abs(x)
    powered = b.square(ax) if p == 2 else b.pow(ax, b.constant(p, dt))
    total = b.window_sum(powered, **_window_attrs(kernel, strides, dilations, pads, extra, cl))
    y = b.sqrt(total) if p == 2 else b.pow(total, b.constant(1.0 / p, dt))
    return [_wrap(y, cl)]


def _spatial_axes(rank: int, channels_last: bool) -> list[int]:
    return list(range(1, rank - 1)) if channels_last else list(range(2, rank))


@converter("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def global_pool(ctx: Context) -> list:
    """The mean, max (or Lp norm) over the spatial dims, kept as size 1."""
    b = ctx.b
    rank = len(ctx.shape(0))
    if rank < 3:
        raise ctx.fail(f"the input must be [N, C, *spatial]; found rank {rank}")
    x, cl = _input_following(ctx)
    axes = _spatial_axes(rank, cl)
    op = ctx.node.op_type
    if op == "GlobalAveragePool":
        y = b.mean(x, axes=axes, keepdims=True)
    elif op == "GlobalMaxPool":
        y = b.reduce_max(x, axes=axes, keepdims=True)
    else:
        p = float(ctx.attr("p", 2))
        dt = _dtype_name(ctx.dtype(0))
        ax = b.abs(x)
        powered = b.square(ax) if p == 2 else b.pow(ax, b.constant(p, dt))
        total = b.sum(powered, axes=axes, keepdims=True)
        y = b.sqrt(total) if p == 2 else b.pow(total, b.constant(1.0 / p, dt))
    return [_wrap(y, cl)]


# -- normalizations ------------------------------------------------------------------------

@converter("BatchNormalization")
def batch_normalization(ctx: Context) -> list:
    """Inference mode: ``(x - mean) / sqrt(var + eps) * scale + B``, folded
    to one multiply-add when the statistics are known at import."""
    if int(ctx.attr("training_mode", 0)):
        raise ctx.fail("training_mode=1 is not supported (inference only)")
    if any(ctx.wants_output(i) for i in (1, 2)):
        raise ctx.fail("running_mean/running_var outputs exist only in training mode, "
                       "which is not supported")
    eps = float(ctx.attr("epsilon", 1e-5))
    rank = len(ctx.shape(0))
    x, cl = _input_following(ctx)
    dtype = ctx.dtype(0)
    consts = [ctx.constant(i) for i in range(1, 5)]
    if all(c is not None and c.dtype != object for c in consts):
        scale, bias, mean, var = (np.asarray(c, np.float64) for c in consts)
        mul = scale / np.sqrt(var + eps)
        add = bias - mean * mul
        shape = _channel_shape(rank, mul.size, cl) if rank >= 2 else [mul.size]
        key = f"{ctx.node.output[0]}.bn"
        m = _import_constant(ctx, key + ".scale", mul.astype(dtype).reshape(shape))
        a = _import_constant(ctx, key + ".shift", add.astype(dtype).reshape(shape))
        return [_wrap(x * m + a, cl)]
    b = ctx.b
    scale, bias, mean, var = (_per_channel(ctx, i, rank, cl, dtype) for i in range(1, 5))
    inv = b.rsqrt(var + b.constant(eps, _dtype_name(dtype)))
    return [_wrap((x - mean) * (inv * scale) + bias, cl)]


@converter("InstanceNormalization")
def instance_normalization(ctx: Context) -> list:
    """Per sample and channel over the spatial dims."""
    b = ctx.b
    eps = float(ctx.attr("epsilon", 1e-5))
    rank = len(ctx.shape(0))
    x, cl = _input_following(ctx)
    dtype = ctx.dtype(0)
    axes = _spatial_axes(rank, cl)
    mean = b.mean(x, axes=axes, keepdims=True)
    var = b.var(x, axes=axes, keepdims=True)
    y = (x - mean) * b.rsqrt(var + b.constant(eps, _dtype_name(dtype)))
    y = y * _per_channel(ctx, 1, rank, cl, dtype) + _per_channel(ctx, 2, rank, cl, dtype)
    return [_wrap(y, cl)]


def _stash(ctx: Context, x, dtype):
    """``x`` in the stash type (float32 by default) for the statistics."""
    stash = int(ctx.attr("stash_type", 1))
    want = {1: np.float32, 11: np.float64, 10: np.float16, 16: None}.get(stash, -1)
    if want == -1:
        raise ctx.fail(f"stash_type={stash} is not supported")
    if want is None or np.dtype(want) == np.dtype(dtype):
        return x, False
    return ctx.b.astype(x, dtype=np.dtype(want).name), True


def _normalized_over_trailing_axes(ctx: Context):
    """What LayerNormalization and RMSNormalization share: input 0 in its
    stash type, whether it was cast, its own dtype, the axes ``[axis,
    rank)`` (``axis`` checked), ``epsilon`` and the stash type's name."""
    rank = len(ctx.shape(0))
    axis = int(ctx.attr("axis", -1))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        raise ctx.fail(f"axis {ctx.attr('axis', -1)} is out of range for rank {rank}")
    dtype = ctx.dtype(0)
    xs, cast = _stash(ctx, ctx.input(0), dtype)
    return (xs, cast, dtype, list(range(axis, rank)), float(ctx.attr("epsilon", 1e-5)),
            str(xs.dtype).split(".")[-1])


@converter("LayerNormalization")
def layer_normalization(ctx: Context) -> list:
    """Over axes ``[axis, rank)``; Mean and InvStdDev outputs (reduced dims
    kept as 1) when asked for."""
    b = ctx.b
    xs, cast, dtype, axes, eps, sdt = _normalized_over_trailing_axes(ctx)
    mean = b.mean(xs, axes=axes, keepdims=True)
    centered = xs - mean
    var = b.mean(b.square(centered), axes=axes, keepdims=True)
    inv = b.rsqrt(var + b.constant(eps, sdt))
    y = centered * inv
    if cast:
        y = b.astype(y, dtype=_dtype_name(dtype))
    y = y * ctx.input(1)
    if ctx.has_input(2):
        y = y + ctx.input(2)
    results = [y, mean if ctx.wants_output(1) else None, inv if ctx.wants_output(2) else None]
    return results[:ctx.num_outputs]


@converter("GroupNormalization")
def group_normalization(ctx: Context) -> list:
    """Channels in ``num_groups`` groups, each normalized over its channels
    and the spatial dims; scale and bias per channel (per group before
    opset 21)."""
    b = ctx.b
    shape = ctx.shape(0)
    rank = len(shape)
    groups = int(ctx.attr("num_groups"))
    eps = float(ctx.attr("epsilon", 1e-5))
    channels = shape[1]
    if not isinstance(channels, int) or channels % groups:
        raise ctx.fail(f"the channels ({channels}) must be static and divisible by "
                       f"num_groups={groups}")
    dtype = ctx.dtype(0)
    x = ctx.input(0)
    xs, cast = _stash(ctx, x, dtype)
    sdt = str(xs.dtype).split(".")[-1]
    grouped = b.reshape(xs, shape=[shape[0], groups, -1])
    mean = b.mean(grouped, axes=[2], keepdims=True)
    centered = grouped - mean
    var = b.mean(b.square(centered), axes=[2], keepdims=True)
    y = centered * b.rsqrt(var + b.constant(eps, sdt))
    y = b.reshape(y, shape=list(shape))
    if cast:
        y = b.astype(y, dtype=_dtype_name(dtype))
    per = [1, channels] + [1] * (rank - 2)
    out = []
    for i in (1, 2):
        const = ctx.constant(i)
        if const is not None and const.dtype != object:
            arr = np.asarray(const).astype(dtype).reshape(-1)
            if arr.size == groups and groups != channels:
                arr = np.repeat(arr, channels // groups)
            out.append(_import_constant(ctx, f"{ctx.node.input[i]}.gn", arr.reshape(per)))
        else:
            v = ctx.input(i)
            if ctx.shape(i)[0] == groups and groups != channels:
                v = b.reshape(b.broadcast_to(b.reshape(v, shape=[groups, 1]),
                                             shape=[groups, channels // groups]), shape=[-1])
            out.append(b.reshape(v, shape=per))
    return [y * out[0] + out[1]]


@converter("LpNormalization")
def lp_normalization(ctx: Context) -> list:
    """``x / ||x||_p`` along ``axis`` (p 1 or 2)."""
    b = ctx.b
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        raise ctx.fail(f"p={p} is not supported (1 or 2)")
    axis = int(ctx.attr("axis", -1))
    x = ctx.input(0)
    norm = (b.sum(b.abs(x), axes=[axis], keepdims=True) if p == 1
            else b.sqrt(b.sum(b.square(x), axes=[axis], keepdims=True)))
    zero = b.equal(norm, ctx.scalar(0, norm))
    return [b.select(zero, ctx.scalar(0, x), x / norm)]  # 0 where the norm is 0, as ONNX's


@converter("MeanVarianceNormalization")
def mean_variance_normalization(ctx: Context) -> list:
    """``(x - mean) / sqrt(var)`` over ``axes`` (default [0, 2, 3])."""
    b = ctx.b
    axes = [int(a) for a in ctx.attr("axes", [0, 2, 3])]
    x = ctx.input(0)
    mean = b.mean(x, axes=axes, keepdims=True)
    centered = x - mean
    var = b.mean(b.square(centered), axes=axes, keepdims=True)
    return [centered / b.sqrt(var)]


@converter("LRN")
def lrn(ctx: Context) -> list:
    """``x / (bias + alpha / size * sum of x^2 over nearby channels)^beta``."""
    b = ctx.b
    size = int(ctx.attr("size"))
    alpha = float(ctx.attr("alpha", 1e-4))
    beta = float(ctx.attr("beta", 0.75))
    bias = float(ctx.attr("bias", 1.0))
    rank = len(ctx.shape(0))
    x, cl = _input_following(ctx)
    dt = _dtype_name(ctx.dtype(0))
    lo, hi = (size - 1) // 2, math.ceil((size - 1) / 2)
    caxis = rank - 1 if cl else 1
    dims = [1] * rank
    dims[caxis] = size
    pad = [[0, 0]] * rank
    pad[caxis] = [lo, hi]
    sq = b.window_sum(b.square(x), window_dimensions=dims, padding=pad)
    denom = b.pow(sq * b.constant(alpha / size, dt) + b.constant(bias, dt), b.constant(beta, dt))
    return [_wrap(x / denom, cl)]


@converter("Dropout")
def dropout(ctx: Context) -> list:
    """Inference: the identity (and an all-true mask); training_mode must be
    false (known at import)."""
    if ctx.has_input(2):
        training = ctx.constant(2)
        if training is None:
            raise ctx.fail("training_mode must be known at import (inference only)")
        if bool(np.asarray(training).reshape(-1)[0]):
            raise ctx.fail("training_mode=true is not supported (inference only)")
    entry = ctx.scope.lookup(ctx.node.input[0])
    y = entry if isinstance(entry, ChannelsLast) else ctx.input(0)
    mask = None
    if ctx.wants_output(1):
        mask = ctx.b.full(shape=list(ctx.shape(0)), dtype="bool", value=True)
    return [y, mask][:ctx.num_outputs]


@converter("RMSNormalization")
def rms_normalization(ctx: Context) -> list:
    """``x / sqrt(mean(x * x) + epsilon) * scale`` over axes ``[axis, rank)``,
    the statistics in the stash type (float32 by default), the result cast
    back to the input's type before the scale (unidirectionally broadcast)."""
    b = ctx.b
    xs, cast, dtype, axes, eps, sdt = _normalized_over_trailing_axes(ctx)
    ms = b.mean(b.square(xs), axes=axes, keepdims=True)
    y = xs * b.rsqrt(ms + b.constant(eps, sdt))
    if cast:
        y = b.astype(y, dtype=_dtype_name(dtype))
    return [y * ctx.input(1)]
