"""Convolutions in MLX's channels-last layout.

Inputs are ``[N, *spatial, C_in]`` and weights ``[C_out, *kernel, C_in / groups]``
(the kernel has one dimension per spatial dimension); results are
``[N, *spatial_out, C_out]``. Channel-first data (NCHW / OIHW) must be transposed
first. Per-spatial-dimension attributes are lists with one entry per spatial
dimension.

With native kernels on (:mod:`mlxprog.native`), float32 ``conv_general``
without input dilation or flip runs mlxprog's own kernels on the CPU (a GEMM
over the patches, gathered as it packs; depthwise convolutions directly);
``conv_transpose`` (input dilation, flipped kernel) stays MLX's.
"""

from __future__ import annotations

from typing import Literal

import mlx.core as mx

from ..arrays import AVal, name_of
from ..native import kernels as native
from .attrs import Attrs, PositiveSize, Size
from .registry import register_op

Padding = tuple[Size, Size]
"""``[low, high]`` padding of one spatial dimension."""


def _check_layouts(avals: list[AVal], groups: int, spatial_ranks: range | None = None) -> int:
    """Check the input/weight ranks and channel counts; return the spatial rank."""
    x, w = avals[0].shape, avals[1].shape
    spatial = len(x) - 2
    if spatial < 1 or (spatial_ranks is not None and spatial not in spatial_ranks):
        allowed = "at least 1"
        if spatial_ranks is not None:
            allowed = f"{spatial_ranks[0]} to {spatial_ranks[-1]}"
        raise ValueError(
            f"input (operand 0) must be [N, *spatial, C_in] with {allowed} spatial "
            f"dimension(s); found shape {list(x)}"
        )
    if len(w) != len(x):
        raise ValueError(
            f"weight (operand 1) must be [C_out, *kernel, C_in / groups] of rank {len(x)} "
            f"like the input; found shape {list(w)}"
        )
    if x[-1] != w[-1] * groups:
        raise ValueError(
            f"input channels {x[-1]} must equal the weight's last dimension {w[-1]} times "
            f"groups {groups}"
        )
    if w[0] % groups:
        raise ValueError(f"output channels {w[0]} must be divisible by groups {groups}")
    if 0 in w[1:-1]:
        raise ValueError(
            f"kernel sizes (weight axes 1 to {spatial}) must be positive; found weight shape "
            f"{list(w)}"
        )
    return spatial


def _without_channels(x: mx.array, w: mx.array, out: mx.array) -> mx.array:
    """``out``, or zeros of its shape when there are no input or no output
    channels: nothing is summed, and MLX's GEMM would reject the zero size
    (or divide by it) during evaluation."""
    if x.shape[-1] == 0 or w.shape[0] == 0:
        return mx.zeros(out.shape, out.dtype)
    return out


def _check_lengths(attrs: Attrs, spatial: int) -> None:
    """Check that every per-spatial-dimension list has one entry per dimension."""
    for name in type(attrs).model_fields:
        value = getattr(attrs, name)
        if isinstance(value, list) and len(value) != spatial:
            raise ValueError(
                f"{name} needs one entry per spatial dimension ({spatial}); found {len(value)}"
            )


class ConvGeneralAttrs(Attrs):
    """The attributes of ``conv_general``."""

    stride: list[PositiveSize] | None = None
    """Step of the kernel per spatial dimension (default 1)."""
    padding: list[Padding] | None = None
    """``[low, high]`` zero padding per spatial dimension (default none)."""
    kernel_dilation: list[PositiveSize] | None = None
    """Spacing between kernel taps per spatial dimension (default 1)."""
    input_dilation: list[PositiveSize] | None = None
    """Spacing inserted between input elements per spatial dimension (default 1)."""
    groups: PositiveSize = 1
    """Feature groups: channels split into ``groups`` independent convolutions."""
    flip: bool = False
    """Flip the kernel (true convolution) instead of cross-correlating."""
    activation: Literal["none", "relu"] = "none"
    """Applied to the result after the bias: ``"relu"`` is ``max(y, 0)``
    (fused into the native kernel, which applies it as each output tile is
    finished)."""


def _check_conv_general(avals: list[AVal], attrs: ConvGeneralAttrs) -> None:
    """Input and weight layouts, one attribute entry per spatial dimension,
    the bias (operand 2, optional): one value per output channel, and the
    residual (operand 3, optional): the result's shape; both of the input's
    dtype."""
    spatial = _check_layouts(avals, attrs.groups)
    _check_lengths(attrs, spatial)
    (x_shape, x_dtype), (w_shape, _) = avals[:2]
    if len(avals) > 2:
        b_shape, b_dtype = avals[2]
        if tuple(b_shape) != (w_shape[0],) or b_dtype != x_dtype:
            raise ValueError(
                f"bias (operand 2) must be [C_out] = [{w_shape[0]}] of the input's dtype "
                f"{name_of(x_dtype)}; found shape {list(b_shape)} of {name_of(b_dtype)}")
    if len(avals) > 3:
        r_shape, r_dtype = avals[3]
        shape = _conv_general_shape(x_shape, w_shape, _conv_general_options(attrs, spatial))
        if tuple(r_shape) != shape or r_dtype != x_dtype:
            raise ValueError(
                f"residual (operand 3) must have the result's shape {list(shape)} and the "
                f"input's dtype {name_of(x_dtype)}; found shape {list(r_shape)} of "
                f"{name_of(r_dtype)}")


def _conv_general_shape(x: tuple, w: tuple, options: dict) -> tuple:
    """The shape of ``conv_general``'s result (``options``: its attributes
    filled in, as :func:`_conv_general_options` gives them)."""
    spatial = [((n - 1) * dil + 1 + lo + hi - ((k - 1) * kdil + 1)) // s + 1
               for n, k, s, (lo, hi), kdil, dil in zip(
                   x[1:-1], w[1:-1], options["stride"], options["padding"],
                   options["kernel_dilation"], options["input_dilation"])]
    return (x[0], *spatial, w[0])


def _conv_general_covered(avals: list[AVal], attrs: ConvGeneralAttrs) -> bool:
    """Whether the native convolution computes this ``conv_general``."""
    return native.covers_conv(*avals, **_conv_general_options(attrs, len(avals[0].shape) - 2))


def _conv_general_options(attrs: ConvGeneralAttrs, spatial: int) -> dict:
    """``conv_general``'s attributes with their defaults filled in, one entry
    per spatial dimension, as the native convolution takes them."""
    return dict(stride=attrs.stride or [1] * spatial,
                padding=attrs.padding or [(0, 0)] * spatial,
                kernel_dilation=attrs.kernel_dilation or [1] * spatial,
                input_dilation=attrs.input_dilation or [1] * spatial,
                groups=attrs.groups, flip=attrs.flip)


@register_op("conv_general", attrs=ConvGeneralAttrs, operands=(2, 4),
             check=_check_conv_general, context=True, native_coverage=_conv_general_covered)
def conv_general(operands, attrs, context):
    """N-d convolution (``mx.conv_general``), cross-correlation unless ``flip``.
    Operands: input ``[N, *spatial, C_in]`` and weight
    ``[C_out, *kernel, C_in / groups]``; result ``[N, *spatial_out, C_out]``. The
    input is dilated by ``input_dilation`` (``d - 1`` zeros between elements),
    then zero-padded by ``padding``; the kernel, dilated by ``kernel_dilation``,
    moves in steps of ``stride``. Per spatial dimension:
    ``out = (((in - 1) * input_dilation + 1 + low + high - ((k - 1) *
    kernel_dilation + 1)) // stride) + 1``. Output channel group ``g`` sees
    input channel group ``g``; MLX supports ``groups > 1`` only with 1 or 2
    spatial dimensions. Kernel sizes must be positive; with no input channels
    the result is zeros (plus the bias). The optional third operand, a bias
    ``[C_out]`` of the input's dtype, is added per output channel, and the
    optional fourth, a residual of the result's shape (a residual block's
    shortcut; it needs the bias before it), element by element; then
    ``activation`` is applied: ``conv_general(x, w, b, z, activation="relu")``
    is ``relu(conv_general(x, w) + b + z)``, which the native kernel computes
    as it finishes each tile of the result, with no pass of its own."""
    x, w, *rest = operands
    bias, residual = (rest + [None, None])[:2]
    out = native.conv(context.native, x, w, **_conv_general_options(attrs, x.ndim - 2),
                      op="conv_general", bias=bias, residual=residual,
                      activation=attrs.activation)
    if out is not None:
        return out
    return _finish(_mlx_conv_general(x, w, attrs), bias, residual, attrs.activation)


def _finish(out: mx.array, bias: mx.array | None, residual: mx.array | None,
            activation: str) -> mx.array:
    """``conv_general``'s epilogue outside the native kernel: the bias and the
    residual, then the activation."""
    if bias is not None:
        out = out + bias
    if residual is not None:
        out = out + residual
    if activation == "relu":
        out = mx.maximum(out, mx.array(0, out.dtype))
    return out


def _mlx_conv_general(x: mx.array, w: mx.array, attrs: ConvGeneralAttrs) -> mx.array:
    """``mx.conv_general`` with ``attrs`` (zeros without channels)."""
    padding = attrs.padding or [(0, 0)] * (x.ndim - 2)
    out = mx.conv_general(
        x,
        w,
        stride=attrs.stride or 1,
        padding=([lo for lo, _ in padding], [hi for _, hi in padding]),
        kernel_dilation=attrs.kernel_dilation or 1,
        input_dilation=attrs.input_dilation or 1,
        groups=attrs.groups,
        flip=attrs.flip,
    )
    return _without_channels(x, w, out)


class ConvTransposeAttrs(Attrs):
    """The attributes of ``conv_transpose``."""

    stride: list[PositiveSize] | None = None
    """Upsampling step per spatial dimension (default 1)."""
    padding: list[Size] | None = None
    """Symmetric padding removed from both ends per spatial dimension (default 0)."""
    dilation: list[PositiveSize] | None = None
    """Spacing between kernel taps per spatial dimension (default 1)."""
    output_padding: list[Size] | None = None
    """Extra elements added at the high end per spatial dimension (default 0)."""
    groups: PositiveSize = 1
    """Feature groups."""


def _per_dim(attrs: ConvTransposeAttrs, spatial: int) -> tuple[list[int], ...]:
    """``stride``, ``padding``, ``dilation`` and ``output_padding``, one entry
    per spatial dimension (defaults filled in)."""
    return (attrs.stride or [1] * spatial, attrs.padding or [0] * spatial,
            attrs.dilation or [1] * spatial, attrs.output_padding or [0] * spatial)


def _check_conv_transpose(avals: list[AVal], attrs: ConvTransposeAttrs) -> None:
    """As ``conv_general``'s check, with 1 to 3 spatial dimensions, and a
    result of at least one element along each of them."""
    spatial = _check_layouts(avals, attrs.groups, range(1, 4))
    _check_lengths(attrs, spatial)
    x, w = avals[0].shape, avals[1].shape
    for axis, (size, k, (s, p, d, e)) in enumerate(
            zip(x[1:-1], w[1:-1], zip(*_per_dim(attrs, spatial))), 1):
        out = (size - 1) * s - 2 * p + (k - 1) * d + e + 1
        if out < 1:
            raise ValueError(
                f"the result would have {out} elements along axis {axis}: (in - 1) * stride "
                f"- 2 * padding + (k - 1) * dilation + output_padding + 1 with in {size}, "
                f"stride {s}, padding {p}, k {k}, dilation {d}, output_padding {e}; it "
                f"must be at least 1"
            )


@register_op("conv_transpose", attrs=ConvTransposeAttrs, operands=2,
             check=_check_conv_transpose)
def conv_transpose(operands, attrs):
    """Transposed convolution over 1 to 3 spatial dimensions (as
    ``mx.conv_transpose1d/2d/3d``): the gradient of ``conv_general`` with
    respect to its input. Operands: input ``[N, *spatial, C_in]`` and weight
    ``[C_out, *kernel, C_in / groups]``; result ``[N, *spatial_out, C_out]`` with
    ``out = (in - 1) * stride - 2 * padding + (k - 1) * dilation + output_padding
    + 1``, at least 1: input element ``i`` contributes through kernel tap ``j``
    to output position ``i * stride + j * dilation - padding``. As in
    ``conv_general``, ``groups > 1`` works only with 1 or 2 spatial
    dimensions, kernel sizes must be positive, and no input channels give
    zeros."""
    x, w = operands
    stride, padding, dilation, extra = _per_dim(attrs, x.ndim - 2)
    # MLX's construction: a stride-1 convolution of the input dilated by the
    # stride, with the flipped kernel and (k - 1) * dilation - padding at
    # each end (plus output_padding at the high end). MLX crops for a
    # negative padding before dilating, which is wrong (the result is too
    # short), so the convolution gets the positive part and the result is
    # cropped: with stride 1, cropping the input crops the result alike.
    low = [(k - 1) * d - p for k, d, p in zip(w.shape[1:-1], dilation, padding)]
    high = [lo + e for lo, e in zip(low, extra)]
    out = mx.conv_general(
        x,
        w,
        padding=([max(lo, 0) for lo in low], [max(hi, 0) for hi in high]),
        kernel_dilation=dilation,
        input_dilation=stride,
        groups=attrs.groups,
        flip=True,
    )
    crop = [slice(max(-lo, 0), size - max(-hi, 0))
            for lo, hi, size in zip(low, high, out.shape[1:-1])]
    return _without_channels(x, w, out[(slice(None), *crop, slice(None))])
