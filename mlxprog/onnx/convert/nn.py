"""Neural-network layers: Conv, ConvTranspose, ConvInteger, QLinearConv,
CausalConvWithState, DeformConv, the pools (MaxPool,
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

import mlx.core as mx
import numpy as np

from ...arrays import name_of
from ...errors import ProgramError
from ..context import ChannelsLast, Context
from ..dtypes import dtype_name, is_float_dtype
from ..registry import converter
from .elementwise import same_dtype


# -- helpers -------------------------------------------------------------------------------

def _input_following(ctx: Context, i: int = 0):
    """Input ``i`` in the layout it is held in: ``(value, channels_last)``."""
    if ctx.is_channels_last(i) and len(ctx.shape(i)) >= 3:
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
    """``array`` (computed at import), made contiguous, as a program value
    (:meth:`.Context.known_value`)."""
    return ctx.known_value(key, np.ascontiguousarray(array))


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


def _conv_setup(ctx: Context, w_input: int):
    """A convolution's spatial rank, weight shape (input ``w_input``), and
    ``conv_general`` attributes (strides, pads, dilations), and its groups."""
    sizes = _spatial_sizes(ctx, 0, "the input X")
    n = len(sizes)
    wshape = ctx.shape(w_input)
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
    attrs = dict(stride=strides, padding=[list(p) for p in pads], kernel_dilation=dilations)
    return n, list(wshape), attrs, groups


def _biased_conv(ctx: Context, activation: str = "none", residual: int | None = None):
    """A Conv's channels-last result, its bias (input 2, if given), the
    input ``residual`` (its output's shape; none if None) and
    ``activation`` (``"none"`` or ``"relu"``) passed to ``conv_general``,
    which applies them as it finishes each output tile; a 3-d grouped Conv
    (several ``conv_general``) adds them after."""
    n, wshape, attrs, groups = _conv_setup(ctx, 1)
    x = ctx.input_channels_last(0)
    rank = n + 2
    w = _weight(ctx, 1, lambda a: np.moveaxis(a, 1, -1),
                lambda v: ctx.b.transpose(v, axes=[0, *range(2, rank), 1]), "ohwi")
    z = ctx.input_channels_last(residual) if residual is not None else None
    if groups > 1 and n > 2:
        y = _add_bias(ctx, _conv_cl(ctx, x, w, groups, n, **attrs), 2, rank)
        y = y if z is None else ctx.b.add(y, z)
        return _relu_value(ctx, y) if activation == "relu" else y
    operands = [x, w]
    if ctx.has_input(2):
        if tuple(ctx.shape(2)) != (wshape[0],):
            raise ctx.fail(f"bias B must be [M] = [{wshape[0]}], one per output channel; "
                           f"found {list(ctx.shape(2))}")
        const = ctx.constant(2)
        operands.append(
            _import_constant(ctx, f"{ctx.node.input[2]}.bias",
                             np.asarray(const).astype(ctx.dtype(0)))
            if const is not None and const.dtype != object
            else same_dtype(ctx, ctx.input(2), x))
    elif z is not None:  # the residual operand comes after a bias
        operands.append(ctx.b.zeros(shape=[wshape[0]], dtype=name_of(x.dtype)))
    if z is None:
        return ctx.b.conv_general(*operands, groups=groups, activation=activation, **attrs)
    try:
        return ctx.b.conv_general(*operands, z, groups=groups, activation=activation, **attrs)
    except ProgramError as e:
        raise ctx.fail(f"the sum input Z must have the output's shape: {e}") from e


def _relu_value(ctx: Context, y):
    """``max(y, 0)``."""
    return ctx.b.max(y, ctx.scalar(0, y))


@converter("Conv")
def conv(ctx: Context) -> list:
    """N-d convolution (``conv_general`` with the bias, channels-last result)."""
    return [ChannelsLast(_biased_conv(ctx))]


#: onnxruntime's FusedConv activations applied after the convolution (Relu
#: is fused into it): their ``activation_params`` and how they map ``y``.
_FUSED_ACTIVATIONS = {
    "Tanh": (0, lambda ctx, y: ctx.b.tanh(y)),
    "Sigmoid": (0, lambda ctx, y: ctx.b.sigmoid(y)),
    "LeakyRelu": (1, lambda ctx, y, alpha: ctx.b.select(
        ctx.b.less(y, ctx.scalar(0, y)), ctx.b.multiply(y, ctx.scalar(alpha, y)), y)),
    "Clip": (2, lambda ctx, y, low, high: ctx.b.min(ctx.b.max(y, ctx.scalar(low, y)),
                                                    ctx.scalar(high, y))),
    "HardSigmoid": (2, lambda ctx, y, alpha, beta: ctx.b.min(ctx.b.max(
        ctx.b.add(ctx.b.multiply(y, ctx.scalar(alpha, y)), ctx.scalar(beta, y)),
        ctx.scalar(0, y)), ctx.scalar(1, y))),
}


@converter("FusedConv", domain="com.microsoft")
def fused_conv(ctx: Context) -> list:
    """onnxruntime's Conv with its sum input ``Z`` (optional: input 3, of
    the output's shape) and activation (``activation``, with
    ``activation_params``), as its graph optimizer writes it, and as the
    importer writes each Conv followed by an Add and/or a Relu
    (:func:`~mlxprog.onnx.fold.fuse_conv_epilogue`): ``activation(conv(X,
    W) + B + Z)``. The sum and ``Relu`` run inside ``conv_general``;
    ``Tanh``, ``Sigmoid``, ``LeakyRelu``, ``Clip`` and ``HardSigmoid`` after
    it."""
    residual = 3 if ctx.has_input(3) else None
    activation = ctx.attr("activation", "")
    if activation in ("", "Relu"):
        return [ChannelsLast(_biased_conv(ctx, "relu" if activation else "none", residual))]
    if activation not in _FUSED_ACTIVATIONS:
        raise ctx.fail(f"activation {activation!r} is not one of Relu, "
                       f"{', '.join(_FUSED_ACTIVATIONS)}")
    count, apply = _FUSED_ACTIVATIONS[activation]
    params = [float(v) for v in ctx.attr("activation_params", [])]
    if len(params) != count:
        raise ctx.fail(f"activation {activation} takes {count} activation_params; "
                       f"found {len(params)}")
    return [ChannelsLast(apply(ctx, _biased_conv(ctx, residual=residual), *params))]


def _integer_conv(ctx: Context, x_zero: int, w: int, w_zero: int):
    """The convolution of ``X - x_zero_point`` (input 0, and input
    ``x_zero``: a scalar) and ``W - w_zero_point`` (input ``w``; input
    ``w_zero``: a scalar or one per output channel), exact, channels-last,
    in float32 where every sum of products stays below 2**24 in magnitude
    (8-bit operands: at most 258 products per output), else float64
    (MLX's CPU device). ConvInteger and QLinearConv share it."""
    b = ctx.b
    n, wshape, attrs, groups = _conv_setup(ctx, w)
    rank = n + 2
    terms = int(np.prod(wshape[1:]))
    widest = 1
    for i in (0, w):
        info = np.iinfo(ctx.dtype(i))
        widest *= int(info.max) - int(info.min)  # |value - zero point| at most
    compute = "float32" if terms * widest < 2 ** 24 else "float64"

    def shifted(i: int, zero: int, per_channel: bool):
        v = b.astype(ctx.input(i), dtype="int32")
        if ctx.has_input(zero):
            z = b.astype(ctx.input(zero), dtype="int32")
            if per_channel and z.ndim == 1 and z.shape[0] != 1:
                z = b.reshape(z, shape=[z.shape[0]] + [1] * (rank - 1))
            v = b.subtract(v, z)
        return b.astype(v, dtype=compute)

    x = shifted(0, x_zero, False)
    x = b.transpose(x, axes=[0, *range(2, rank), 1])
    weight = b.transpose(shifted(w, w_zero, True), axes=[0, *range(2, rank), 1])
    y = _conv_cl(ctx, x, weight, groups, n, **attrs)
    return b.astype(b.round(y), dtype="int32"), rank


@converter("ConvInteger")
def conv_integer(ctx: Context) -> list:
    """``Conv(X - x_zero_point, W - w_zero_point)`` in int32, exact."""
    y, _ = _integer_conv(ctx, 2, 1, 3)
    return [ChannelsLast(y)]


@converter("QLinearConv")
def qlinear_conv(ctx: Context) -> list:
    """The quantized convolution: the integer convolution of ``x`` and ``w``
    less their zero points, plus the int32 bias (input 8), times
    ``x_scale * w_scale / y_scale`` (``w_scale`` per output channel or a
    scalar), rounded half to even and saturated into ``y_zero_point``'s
    type, plus it."""
    out = np.dtype(ctx.dtype(7))
    if out not in (np.int8, np.uint8):
        raise ctx.fail(f"y_zero_point is {out}: QLinearConv's output type must be int8 "
                       "or uint8")
    b = ctx.b
    acc, rank = _integer_conv(ctx, 2, 3, 5)
    if ctx.has_input(8):
        acc = b.add(acc, b.astype(ctx.input(8), dtype="int32"))  # [M], channels last

    def scale(i: int):
        return b.astype(b.reshape(ctx.input(i), shape=[-1]), dtype="float32")

    factor = b.divide(b.multiply(scale(1), scale(4)), scale(6))
    y = b.round(b.multiply(b.astype(acc, dtype="float32"), factor))
    y = b.add(y, b.astype(b.reshape(ctx.input(7), shape=[]), dtype="float32"))
    info = np.iinfo(out)
    y = b.clip(y, b.constant(float(info.min), "float32"), b.constant(float(info.max), "float32"))
    return [ChannelsLast(b.astype(y, dtype=dtype_name(out)))]


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
        shape = ctx.symbolic_shape(y)
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
    low = (-np.inf if is_float_dtype(dtype) else np.iinfo(dtype).min)
    fill = b.constant(float(low) if is_float_dtype(dtype) else int(low),
                      dtype_name(dtype))
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
    dtype = dtype_name(ctx.dtype(0))
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
        y = total * ctx.b.constant(float(1.0 / counts.flat[0]), dtype_name(dtype))
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
    dt = dtype_name(ctx.dtype(0))
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
        dt = dtype_name(ctx.dtype(0))
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
    inv = b.rsqrt(var + b.constant(eps, dtype_name(dtype)))
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
    y = (x - mean) * b.rsqrt(var + b.constant(eps, dtype_name(dtype)))
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
        y = b.astype(y, dtype=dtype_name(dtype))
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
        y = b.astype(y, dtype=dtype_name(dtype))
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
    dt = dtype_name(ctx.dtype(0))
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
    y = ctx.input_held(0)
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
        y = b.astype(y, dtype=dtype_name(dtype))
    return [y * ctx.input(1)]


@converter("CausalConvWithState")
def causal_conv_with_state(ctx: Context) -> list:
    """A depthwise causal 1-d convolution of ``input`` (``[B, C, L]``) by
    ``weight`` (``[C, 1, k]``) after ``past_state`` (``[B, C, k-1]``, default
    zeros), plus ``bias``, then ``activation`` (``"none"``, or SiLU as
    ``"silu"``/``"swish"``, in float32); ``present_state`` is the last
    ``k - 1`` steps of the state and input together. Each of the ``k`` taps
    is a slice of them times its weights (no convolution primitive: ``k``
    is small, and a depthwise one would run per channel group)."""
    activation = ctx.choice("activation", ("none", "silu", "swish"), "none")
    shape, wshape = list(ctx.shape(0)), list(ctx.shape(1))
    if len(shape) != 3 or len(wshape) != 3 or wshape[1] != 1 or wshape[0] != shape[1] \
            or not isinstance(wshape[2], int) or wshape[2] < 1:
        raise ctx.fail(f"input {shape} and weight {wshape} must be [B, C, L] and [C, 1, k]")
    batch, channels, length = shape
    k = wshape[2]
    b = ctx.b
    x = ctx.input(0)
    if ctx.has_input(3):
        if list(ctx.shape(3)) != [batch, channels, k - 1]:
            raise ctx.fail(f"past_state must be [B, C, k-1] = {[batch, channels, k - 1]}; "
                           f"its shape is {list(ctx.shape(3))}")
        padded = b.concatenate(same_dtype(ctx, ctx.input(3), x), x, axis=2) if k > 1 else x
    else:
        padded = b.pad(x, ctx.scalar(0, x), pad_width=[[0, 0], [0, 0], [k - 1, 0]])
    # Half-precision inputs accumulate in float32 (as the reference's
    # convolution does), rounded once at the end.
    wide = padded if x.dtype in (mx.float32, mx.float64) else b.astype(padded, dtype="float32")
    w = same_dtype(ctx, ctx.input(1), wide)
    y = None
    for j in range(k):
        tap = b.slice(wide, lengths=[batch, channels, length], starts=[0, 0, j])
        weight = b.slice(w, lengths=[channels, 1, 1], starts=[0, 0, j])
        term = b.multiply(tap, b.reshape(weight, shape=[channels, 1]))
        y = term if y is None else b.add(y, term)
    if ctx.has_input(2):
        y = b.add(y, b.reshape(same_dtype(ctx, ctx.input(2), wide), shape=[channels, 1]))
    y = same_dtype(ctx, y, x)
    if activation != "none":
        wide = b.astype(y, dtype="float32")
        y = same_dtype(ctx, b.multiply(wide, b.sigmoid(wide)), y)
    total = length + k - 1
    present = b.slice(padded, lengths=[batch, channels, k - 1], starts=[0, 0, total - (k - 1)])
    return [y, present]


@converter("DeformConv")
def deform_conv(ctx: Context) -> list:
    """A 2-d deformable convolution: each kernel tap of each output pixel
    reads ``X`` bilinearly (zeros outside) at its regular position moved by
    ``offset`` (``[N, offset_group * kh * kw * 2, oh, ow]``, (dy, dx) pairs),
    times ``mask`` (default ones); the samples, laid out as columns, are
    multiplied by the weights per ``group``, plus ``B``."""
    b = ctx.b
    xshape, wshape, oshape = (list(ctx.shape(i)) for i in range(3))
    if len(xshape) != 4 or len(wshape) != 4 or not all(isinstance(d, int) for d in
                                                         [*xshape[1:], *wshape, *oshape[1:]]):
        raise ctx.fail(f"only 2-d DeformConv with static sizes is supported (X {xshape}, "
                       f"W {wshape})")
    batch, channels, height, width = xshape
    out_c, kh, kw = wshape[0], wshape[2], wshape[3]
    if list(ctx.attr("kernel_shape", [kh, kw])) != [kh, kw]:
        raise ctx.fail(f"kernel_shape differs from the weight's {[kh, kw]}")
    groups, offset_groups = ctx.attr("group", 1), ctx.attr("offset_group", 1)
    strides, dilations = _ints(ctx, "strides", 2, 1), _ints(ctx, "dilations", 2, 1)
    pads = _ints(ctx, "pads", 4, 0)
    oh, ow = oshape[2], oshape[3]
    expected = [(size + pads[a] + pads[a + 2] - (k - 1) * dilations[a] - 1) // strides[a] + 1
                for a, (size, k) in enumerate(((height, kh), (width, kw)))]
    if [oh, ow] != expected:
        raise ctx.fail(f"offset's output size {[oh, ow]} differs from the {expected} that "
                       f"pads {pads}, strides {strides} and dilations {dilations} give")
    taps, pixels = kh * kw, oh * ow
    if (channels != wshape[1] * groups or out_c % groups or channels % offset_groups
            or oshape[1] != offset_groups * taps * 2):
        raise ctx.fail(f"attributes group={groups} and offset_group={offset_groups} do not "
                       f"fit X {xshape}, W {wshape} and offset {oshape}")
    # Each tap's regular position per output pixel: [taps, pixels].
    ki, kj = np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij")
    oi, oj = np.meshgrid(np.arange(oh), np.arange(ow), indexing="ij")
    base_y = (oi.reshape(1, -1) * strides[0] - pads[0] + ki.reshape(-1, 1) * dilations[0])
    base_x = (oj.reshape(1, -1) * strides[1] - pads[1] + kj.reshape(-1, 1) * dilations[1])
    dtype = np.dtype(ctx.dtype(0))
    name = ctx.node.output[0]
    offset = b.reshape(ctx.input(2), shape=[batch, offset_groups, taps, 2, pixels])

    def coordinate(axis: int, base: np.ndarray):
        part = b.slice(offset, lengths=[batch, offset_groups, taps, 1, pixels],
                       starts=[0, 0, 0, axis, 0])
        grid = ctx.known_value(f"{name}.base{axis}", base.astype(dtype))
        return b.add(b.squeeze(part, axes=[3]), grid)  # [N, G, taps, pixels]

    y, x = coordinate(0, base_y), coordinate(1, base_x)
    y0, x0 = b.floor(y), b.floor(x)
    fy, fx = b.subtract(y, y0), b.subtract(x, x0)
    one = ctx.scalar(1, y)
    xs = b.reshape(ctx.input(0), shape=[batch, offset_groups, channels // offset_groups,
                                        height * width])
    sampled = None
    for dy, wy in ((0, b.subtract(one, fy)), (1, fy)):
        for dx, wx in ((0, b.subtract(one, fx)), (1, fx)):
            yc, xc = b.add(y0, ctx.scalar(dy, y0)), b.add(x0, ctx.scalar(dx, x0))
            inside = b.logical_and(
                b.logical_and(b.greater_equal(yc, ctx.scalar(0, yc)),
                              b.less(yc, ctx.scalar(height, yc))),
                b.logical_and(b.greater_equal(xc, ctx.scalar(0, xc)),
                              b.less(xc, ctx.scalar(width, xc))))
            flat = b.add(b.multiply(b.clip(yc, ctx.scalar(0, yc), ctx.scalar(height - 1, yc)),
                                    ctx.scalar(width, yc)),
                         b.clip(xc, ctx.scalar(0, xc), ctx.scalar(width - 1, xc)))
            index = b.reshape(b.astype(flat, dtype="int32"),
                              shape=[batch, offset_groups, 1, taps * pixels])
            index = b.broadcast_to(index, shape=[batch, offset_groups,
                                                 channels // offset_groups, taps * pixels])
            weight = b.select(inside, b.multiply(wy, wx), ctx.scalar(0, wy))
            weight = b.reshape(weight, shape=[batch, offset_groups, 1, taps * pixels])
            term = b.multiply(b.take_along_axis(xs, index, axis=3), weight)
            sampled = term if sampled is None else b.add(sampled, term)
    sampled = b.reshape(sampled, shape=[batch, offset_groups, channels // offset_groups,
                                        taps, pixels])
    if ctx.has_input(4):
        mask = b.reshape(ctx.input(4), shape=[batch, offset_groups, 1, taps, pixels])
        sampled = b.multiply(sampled, same_dtype(ctx, mask, sampled))
    # Columns [N, group, C/group * taps, pixels] against weights [group, M/group, C/group * taps].
    cols = b.reshape(sampled, shape=[batch, groups, channels // groups * taps, pixels])
    w = b.reshape(same_dtype(ctx, ctx.input(1), cols),
                  shape=[1, groups, out_c // groups, channels // groups * taps])
    y = b.reshape(b.matmul(w, cols), shape=[batch, out_c, oh, ow])
    if ctx.has_input(3):
        y = b.add(y, b.reshape(same_dtype(ctx, ctx.input(3), y), shape=[out_c, 1, 1]))
    return [y]
