"""Shape and layout ops: Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze,
Transpose, Expand, Tile, Concat, Split, Slice, Pad, Identity, DepthToSpace,
SpaceToDepth, CenterCropPad.

Shape-valued inputs (a Reshape's shape, a Slice's starts ...) must be known
at import. Where a shape holds symbolic dims, the dims travel as their names
(or dim expressions such as ``"B*3"``) into the attributes that take sizes.
Shape computations whose inputs are all known at import are folded by the
importer; those holding symbolic dims (object arrays) by the shape rules
declared with the converters (:mod:`..shape_rules`), and, where no rule
applies, by the converters here with NumPy on the object arrays (Concat,
Gather, Squeeze, Unsqueeze, Reshape, Transpose, Identity of such arrays;
Cast in :mod:`.tensor`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import shape_rules
from ..context import ChannelsLast, Context
from ..registry import converter
from ..symbolic import shape_value, size_value

Dim = Any  # int | str


# -- helpers -------------------------------------------------------------------------


def _axis(ctx: Context, axis: int, rank: int) -> int:
    """``axis`` in ``[0, rank)`` (negative counts from the end)."""
    if not -rank <= axis < rank:
        raise ctx.fail(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def _dim_str(d: Dim) -> str:
    return str(d) if isinstance(d, (int, np.integer)) else f"({d})"


def prod(dims) -> Dim:
    """The product of dims: an int when every dim is, else a dim expression."""
    number, names = 1, []
    for d in dims:
        if isinstance(d, (int, np.integer)):
            number *= int(d)
        else:
            names.append(_dim_str(d))
    if not names:
        return number
    if number == 0:
        return 0
    return "*".join(names if number == 1 else [str(number), *names])


def _sub(a: Dim, b: Dim) -> Dim:
    if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
        return int(a) - int(b)
    if isinstance(b, (int, np.integer)) and int(b) == 0:
        return a
    return f"{_dim_str(a)}-{_dim_str(b)}"


def _is_int(d: Dim) -> bool:
    return isinstance(d, (int, np.integer))


def _dims(value: np.ndarray) -> list[Dim]:
    """A shape-valued array as a list of ints and dim names."""
    return [v if isinstance(v, str) else int(v) for v in np.asarray(value).reshape(-1).tolist()]


def folded(value: np.ndarray) -> np.ndarray:
    """An object array computed from shapes: int64 again once it holds no dim names."""
    value = np.asarray(value, dtype=object)
    if all(not isinstance(v, str) for v in value.reshape(-1).tolist()):
        return value.astype(np.int64)
    return value


def _symbolic(value) -> bool:
    return isinstance(value, np.ndarray) and value.dtype == object


def _all_constant(ctx: Context, inputs) -> list | None:
    """The inputs' folded values where every given one is known at import
    (some holding symbolic dims), else None."""
    values = [ctx.constant(i) for i in inputs if ctx.has_input(i)]
    return values if all(v is not None for v in values) else None


# -- shapes ----------------------------------------------------------------------------


@converter("Shape")
def shape(ctx: Context) -> list:
    """The input's shape (``start``/``end`` pick a range of axes), known at
    import: int64, or a shape value holding symbolic dims by name."""
    return [shape_value(ctx.shape(0)[ctx.attr("start", 0):ctx.attr("end", None)])]


@converter("Size")
def size(ctx: Context) -> list:
    """The element count (an int64 scalar, or a shape value), known at import."""
    return [size_value(ctx.shape(0))]


@converter("Identity", layout_free=True, shape_rule=shape_rules.UNCHANGED)
def identity(ctx: Context) -> list:
    """The input as it is (a channels-last value stays so)."""
    const = ctx.constant(0)
    if _symbolic(const):
        return [const]
    return [ctx.input_held(0)]


def _reshape_dims(ctx: Context, in_dims: list[Dim], target: list[Dim]) -> list[Dim]:
    allowzero = ctx.attr("allowzero", 0)
    out = []
    for i, t in enumerate(target):
        if _is_int(t) and t == 0 and not allowzero:
            if i >= len(in_dims):
                raise ctx.fail(f"shape entry {i} is 0 (copy) but the input has rank "
                               f"{len(in_dims)}")
            out.append(in_dims[i])
        else:
            out.append(t)
    if sum(1 for d in out if _is_int(d) and d == -1) > 1:
        raise ctx.fail(f"shape {target} has more than one -1")
    if any(_is_int(d) and d < -1 for d in out):
        raise ctx.fail(f"shape {target} has a negative size")
    return out


@converter("Reshape", shape_rule=shape_rules.RESHAPE)
def reshape(ctx: Context) -> list:
    """Reshape to the shape input: 0 copies the input's dim (unless
    ``allowzero``), -1 is inferred."""
    target = _dims(ctx.require_constant(1, "shape"))
    data = ctx.constant(0)
    if _symbolic(data):
        dims = _reshape_dims(ctx, list(data.shape), target)
        if not all(_is_int(d) for d in dims):
            raise ctx.fail("cannot reshape a shape value to a symbolic shape")
        return [folded(data.reshape(dims))]
    dims = _reshape_dims(ctx, list(ctx.shape(0)), target)
    if -1 in dims and all(_is_int(d) for d in ctx.shape(0)) and all(_is_int(d) for d in dims):
        known = prod(d for d in dims if d != -1)
        total = prod(ctx.shape(0))
        if known == 0:
            # -1 beside a zero size: numpy/ONNX infer 0 only if the total is 0.
            if total != 0:
                raise ctx.fail(f"cannot reshape {ctx.shape(0)} to {target}")
            dims = [0 if d == -1 else d for d in dims]
    return [ctx.b.reshape(ctx.input(0), shape=dims)]


@converter("Flatten")
def flatten(ctx: Context) -> list:
    """2-D: the axes before ``axis`` merged, then the rest."""
    dims = list(ctx.shape(0))
    rank = len(dims)
    axis = ctx.attr("axis", 1)
    if not -rank <= axis <= rank:
        raise ctx.fail(f"axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    return [ctx.b.reshape(ctx.input(0), shape=[prod(dims[:axis]), prod(dims[axis:])])]


def _axes_input(ctx: Context, i: int) -> list[int] | None:
    if ctx.has_input(i):
        return ctx.static(i, "axes")
    axes = ctx.attr("axes", None)  # before opset 13
    return None if axes is None else list(axes)


@converter("Squeeze", shape_rule=shape_rules.SQUEEZE)
def squeeze(ctx: Context) -> list:
    """Remove the size-1 ``axes`` (default: every static size-1 axis)."""
    dims = list(ctx.shape(0))
    axes = _axes_input(ctx, 1)
    if axes is None:
        axes = [i for i, d in enumerate(dims) if _is_int(d) and d == 1]
    axes = sorted({_axis(ctx, a, len(dims)) for a in axes})
    for a in axes:
        if dims[a] != 1:
            raise ctx.fail(f"axis {a} has size {dims[a]}, not 1")
    data = ctx.constant(0)
    if _symbolic(data):
        return [folded(np.squeeze(data, axis=tuple(axes)))]
    if not axes:
        return [ctx.input(0)]
    return [ctx.b.squeeze(ctx.input(0), axes=axes)]


@converter("Unsqueeze", shape_rule=shape_rules.UNSQUEEZE)
def unsqueeze(ctx: Context) -> list:
    """Insert size-1 axes at ``axes`` (counted in the result's rank)."""
    axes = _axes_input(ctx, 1)
    if axes is None:
        raise ctx.fail("the axes input is required")
    rank = len(ctx.shape(0)) + len(axes)
    norm = sorted(_axis(ctx, a, rank) for a in axes)
    if len(set(norm)) != len(norm):
        raise ctx.fail(f"axes {axes} repeat an axis")
    data = ctx.constant(0)
    if _symbolic(data):
        return [folded(np.expand_dims(data, tuple(norm)))]
    return [ctx.b.expand_dims(ctx.input(0), axes=norm)]


@converter("Transpose")
def transpose(ctx: Context) -> list:
    """Permute the axes by ``perm`` (default: reversed)."""
    rank = len(ctx.shape(0))
    perm = ctx.attr("perm", None)
    perm = list(range(rank))[::-1] if perm is None else [_axis(ctx, p, rank) for p in perm]
    data = ctx.constant(0)
    if _symbolic(data):
        return [folded(np.transpose(data, perm))]
    if perm == list(range(rank)):
        return [ctx.input(0)]
    return [ctx.b.transpose(ctx.input(0), axes=perm)]


def broadcast_dims(ctx: Context, a: list[Dim], b: list[Dim]) -> list[Dim]:
    """Numpy (multidirectional) broadcasting of two shapes."""
    rank = max(len(a), len(b))
    a = [1] * (rank - len(a)) + list(a)
    b = [1] * (rank - len(b)) + list(b)
    out = []
    for x, y in zip(a, b):
        if _is_int(y) and y == 1:
            out.append(x)
        elif _is_int(x) and x == 1:
            out.append(y)
        elif x == y:
            out.append(x)
        elif not _is_int(x) or not _is_int(y):
            # A symbolic size against another size (not 1): they must be equal
            # at run time; the input's is kept (a broadcast_to of a size to
            # itself), so a symbolic input dim that is 1 at run time is not
            # broadcast here.
            out.append(x)
        else:
            raise ctx.fail(f"shapes {a} and {b} do not broadcast")
    return out


@converter("Expand", shape_rule=shape_rules.EXPAND)
def expand(ctx: Context) -> list:
    """Broadcast to the shape input, numpy style (a 1 there keeps the
    input's size)."""
    target = _dims(ctx.require_constant(1, "shape"))
    dims = broadcast_dims(ctx, list(ctx.shape(0)), target)
    x = ctx.input(0)
    if list(ctx.shape(0)) == dims:
        return [x]
    return [ctx.b.broadcast_to(x, shape=dims)]


@converter("Tile")
def tile(ctx: Context) -> list:
    """Repeat the input ``repeats[i]`` times along each axis i."""
    repeats = ctx.static(1, "repeats")
    dims = list(ctx.shape(0))
    if len(repeats) != len(dims):
        raise ctx.fail(f"repeats {repeats} has {len(repeats)} entries for rank {len(dims)}")
    if any(r < 0 for r in repeats):
        raise ctx.fail(f"repeats {repeats} has a negative entry")
    x = ctx.input(0)
    if all(r == 1 for r in repeats):
        return [x]
    rank = len(dims)
    # [d0, d1, ...] -> [1, d0, 1, d1, ...] -> [r0, d0, r1, d1, ...] -> [r0*d0, ...]
    x = ctx.b.expand_dims(x, axes=[2 * i for i in range(rank)])
    x = ctx.b.broadcast_to(x, shape=[v for r, d in zip(repeats, dims) for v in (r, d)])
    return [ctx.b.reshape(x, shape=[prod([r, d]) for r, d in zip(repeats, dims)])]


def _concat_channels_last(ctx: Context) -> list | None:
    """Inputs all held channels-last, joined along the channel axis as they
    are held (None along another axis)."""
    rank = len(ctx.input_channels_last(0).shape)
    if ctx.attr("axis") % rank != 1:
        return None
    parts = [ctx.input_channels_last(i) for i in range(ctx.num_inputs)]
    return [ChannelsLast(ctx.b.concatenate(*parts, axis=rank - 1))]


@converter("Concat", channels_last=_concat_channels_last, shape_rule=shape_rules.CONCAT)
def concat(ctx: Context) -> list:
    """Join the inputs along ``axis``."""
    given = [i for i in range(ctx.num_inputs) if ctx.has_input(i)]
    rank = len(ctx.shape(given[0]))
    axis = _axis(ctx, ctx.attr("axis"), rank)
    consts = _all_constant(ctx, given)
    if consts is not None:  # shape arithmetic with symbolic dims
        return [folded(np.concatenate([np.asarray(c, dtype=object) for c in consts], axis=axis))]
    # Empty inputs may be left out (ONNX allows a zero-size operand).
    parts = [i for i in given if not any(_is_int(d) and d == 0 for d in ctx.shape(i))]
    if not parts:
        return [ctx.input(given[0])]
    values = [ctx.input(i) for i in parts]
    if len(values) == 1:
        return values
    return [ctx.b.concatenate(*values, axis=axis)]


@converter("Split")
def split(ctx: Context) -> list:
    """Split along ``axis`` by the ``split`` input's sizes, or into
    ``num_outputs`` parts (the last one smaller when the axis does not divide)."""
    dims = list(ctx.shape(0))
    axis = _axis(ctx, ctx.attr("axis", 0), len(dims))
    n = ctx.num_outputs
    if ctx.has_input(1):
        sizes = ctx.static(1, "split")
    elif ctx.attr("split", None) is not None:  # before opset 13
        sizes = list(ctx.attr("split"))
    else:
        d = dims[axis]
        if not _is_int(d):
            if ctx.attr("num_outputs", n) != n:
                raise ctx.fail("num_outputs differs from the number of outputs")
            if n == 1:
                return [ctx.input(0)]
            return list(ctx.b.split(ctx.input(0), indices_or_sections=n, axis=axis))
        parts = ctx.attr("num_outputs", n)
        if parts != n:
            raise ctx.fail(f"num_outputs={parts} but the node has {n} outputs")
        if ctx.attr("num_outputs", None) is None:
            if d % n:
                raise ctx.fail(f"axis size {d} does not split into {n} equal parts")
            sizes = [d // n] * n
        else:
            chunk = -(-d // n)
            sizes = [chunk] * (n - 1) + [d - chunk * (n - 1)]
            if sizes[-1] < 0:
                raise ctx.fail(f"axis size {d} does not split into {n} parts")
    if len(sizes) != n:
        raise ctx.fail(f"split {sizes} has {len(sizes)} entries for {n} outputs")
    if any(s < 0 for s in sizes):
        raise ctx.fail(f"split {sizes} has a negative size")
    if _is_int(dims[axis]) and sum(sizes) != dims[axis]:
        raise ctx.fail(f"split {sizes} does not sum to the axis size {dims[axis]}")
    x = ctx.input(0)
    if n == 1:
        return [x]
    indices = list(np.cumsum(sizes[:-1]).tolist())
    return list(ctx.b.split(x, indices_or_sections=indices, axis=axis))


# -- Slice ----------------------------------------------------------------------------------

_BIG = 2 ** 31 - 1


def _slice_params(ctx: Context, rank: int):
    starts = _dims(ctx.require_constant(1, "starts"))
    ends = _dims(ctx.require_constant(2, "ends"))
    axes = ctx.static(3, "axes") if ctx.has_input(3) else list(range(len(starts)))
    steps = ctx.static(4, "steps") if ctx.has_input(4) else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.fail("starts, ends, axes and steps must have equal lengths")
    axes = [_axis(ctx, a, rank) for a in axes]
    if len(set(axes)) != len(axes):
        raise ctx.fail(f"axes {axes} repeat an axis")
    if 0 in steps:
        raise ctx.fail("a step is 0")
    return dict(zip(axes, zip(starts, ends, steps)))


def _symbolic_bound(d: Dim, bound: Dim, is_end: bool) -> Dim:
    """A start/end on an axis of size ``d`` where ``d`` or the bound is
    symbolic: negative counts from the end, an end past ``2**31 - 2`` is the
    axis end. The bound is taken to lie within the axis (ONNX would clamp)."""
    if not _is_int(bound):
        return bound
    if bound < 0:
        return _sub(d, -bound)
    if is_end and bound >= _BIG:
        return d
    return bound


@converter("Slice", shape_rule=shape_rules.SLICE)
def slice_(ctx: Context) -> list:
    """``x[start:end:step]`` per axis, with ONNX's clamping (numpy's) and
    negative steps (the axis reversed, then sliced). On a symbolic axis, or
    with symbolic starts/ends (from ``Shape``), only positive steps are
    supported, and the bounds are taken to lie within the axis."""
    dims = list(ctx.shape(0))
    params = _slice_params(ctx, len(dims))
    data = ctx.constant(0)
    if _symbolic(data):
        if not all(_is_int(v) for p in params.values() for v in p):
            raise ctx.fail("symbolic starts/ends of a shape value are not supported")
        index = tuple(slice(*params[a]) if a in params else slice(None)
                      for a in range(len(dims)))
        return [folded(data[index])]
    x = ctx.input(0)
    lengths, starts, strides, reverse = [], [], [], []
    for a, d in enumerate(dims):
        if a not in params:
            lengths.append(d), starts.append(0), strides.append(1)
            continue
        start, end, step = params[a]
        if not (_is_int(d) and _is_int(start) and _is_int(end)):
            if step < 0:
                raise ctx.fail(f"axis {a} (size {d}, start {start}, end {end}): a negative "
                               "step with symbolic sizes or bounds is not supported")
            lo = _symbolic_bound(d, start, False)
            hi = _symbolic_bound(d, end, True)
            lengths.append(_sub(hi, lo)), starts.append(lo), strides.append(step)
            continue
        lo, hi, st = slice(start, end, step).indices(d)
        if st < 0:
            reverse.append(a)
            lo, hi, st = d - 1 - lo, d - 1 - hi, -st
        lengths.append(max(0, hi - lo))
        starts.append(lo if hi > lo else 0)
        strides.append(st)
    if reverse:
        x = ctx.b.reverse(x, axes=reverse)
    if lengths == dims and all(s == 1 for s in strides) and all(s == 0 for s in starts):
        return [x]
    return [ctx.b.slice(x, lengths=lengths, starts=starts, strides=strides)]


# -- Pad ----------------------------------------------------------------------------------------


def _pad_index(d: int, lo: int, hi: int, mode: str) -> np.ndarray:
    """The source index of each element of an axis of size ``d`` padded by
    ``lo``/``hi`` (negative: cropped) in ``mode`` (numpy's ``np.pad``)."""
    idx = np.arange(d)
    idx = idx[max(0, -lo): d - max(0, -hi)]
    padded = np.pad(idx, (max(0, lo), max(0, hi)), mode=mode)
    return padded


@converter("Pad")
def pad(ctx: Context) -> list:
    """Pad by the ``pads`` input (``[begins..., ends...]`` over ``axes``):
    ``constant`` (with ``constant_value``, negative pads crop), ``edge``,
    ``reflect`` and ``wrap`` (gathered along each axis by an index array
    computed at import)."""
    mode = ctx.choice("mode", ("constant", "reflect", "edge", "wrap"), "constant")
    dims = list(ctx.shape(0))
    rank = len(dims)
    pads = ctx.static(1, "pads")
    axes = ctx.static(3, "axes") if ctx.has_input(3) else list(range(rank))
    axes = [_axis(ctx, a, rank) for a in axes]
    if len(pads) != 2 * len(axes):
        raise ctx.fail(f"pads {pads} must hold 2 entries per axis ({len(axes)} axes)")
    width = [[0, 0] for _ in range(rank)]
    for i, a in enumerate(axes):
        width[a] = [pads[i], pads[len(axes) + i]]
    x = ctx.input(0)
    if all(w == [0, 0] for w in width):
        return [x]
    if mode == "constant":
        if ctx.has_input(2) and any(_is_int(d) and d == 0 for d in ctx.shape(2)):
            value = ctx.scalar(0, x)
        elif ctx.has_input(2):
            value = ctx.input(2)
            if value.ndim:
                value = ctx.b.reshape(value, shape=[])
        else:
            value = ctx.scalar(0, x)
        return [ctx.b.pad(x, value, pad_width=width)]
    for a, (lo, hi) in enumerate(width):
        if lo == 0 and hi == 0:
            continue
        d = dims[a]
        if not _is_int(d):
            raise ctx.fail(f"mode {mode!r} needs a static size on axis {a} (it is {d})")
        if d == 0:
            raise ctx.fail(f"mode {mode!r} cannot pad the empty axis {a}")
        if mode == "reflect" and d == 1 and max(lo, hi) > 0:
            mode_a = "edge"  # numpy reflects a single element as edge padding
        else:
            mode_a = mode
        idx = _pad_index(d, lo, hi, mode_a)
        x = ctx.b.take(x, ctx.b.constant(idx.tolist(), "int32"), axis=a)
    return [x]


# -- DepthToSpace / SpaceToDepth -------------------------------------------------------------


def _block_geometry(ctx: Context) -> tuple:
    """DepthToSpace's and SpaceToDepth's ``(blocksize, mode, [N, C, H, W])``;
    the input must be 4-D."""
    bs = ctx.attr("blocksize")
    mode = ctx.choice("mode", ("DCR", "CRD"), "DCR")
    dims = list(ctx.shape(0))
    if len(dims) != 4:
        raise ctx.fail("the input must be 4-D")
    return bs, mode, dims


@converter("DepthToSpace")
def depth_to_space(ctx: Context) -> list:
    """``[N, C, H, W] -> [N, C/bs², H*bs, W*bs]`` in ``DCR`` or ``CRD`` order."""
    bs, mode, (n, c, h, w) = _block_geometry(ctx)
    if not _is_int(c) or c % (bs * bs):
        raise ctx.fail(f"channels {c} are not a static multiple of blocksize² {bs * bs}")
    b = ctx.b
    x = ctx.input(0)
    if mode == "DCR":
        x = b.reshape(x, shape=[n, bs, bs, c // (bs * bs), h, w])
        x = b.transpose(x, axes=[0, 3, 4, 1, 5, 2])
    else:
        x = b.reshape(x, shape=[n, c // (bs * bs), bs, bs, h, w])
        x = b.transpose(x, axes=[0, 1, 4, 2, 5, 3])
    return [b.reshape(x, shape=[n, c // (bs * bs), prod([h, bs]), prod([w, bs])])]


@converter("SpaceToDepth")
def space_to_depth(ctx: Context) -> list:
    """``[N, C, H, W] -> [N, C*bs², H/bs, W/bs]``, blocks ordered ``DCR``
    (depth-column-row, the default) or ``CRD`` (opset 28)."""
    bs, mode, (n, c, h, w) = _block_geometry(ctx)
    if not (_is_int(h) and _is_int(w)) or h % bs or w % bs:
        raise ctx.fail(f"height {h} and width {w} must be static multiples of {bs}")
    b = ctx.b
    x = b.reshape(ctx.input(0), shape=[n, c, h // bs, bs, w // bs, bs])
    x = b.transpose(x, axes=[0, 3, 5, 1, 2, 4] if mode == "DCR" else [0, 1, 3, 5, 2, 4])
    return [b.reshape(x, shape=[n, prod([c, bs * bs]), h // bs, w // bs])]


@converter("CenterCropPad")
def center_crop_pad(ctx: Context) -> list:
    """The input cropped or zero-padded to ``shape`` (input 1, known at
    import) along ``axes`` (default all), centred: the odd element of a
    crop or pad goes to the end."""
    dims = list(ctx.shape(0))
    rank = len(dims)
    axes = [_axis(ctx, a, rank) for a in ctx.attr("axes", list(range(rank)))]
    sizes = ctx.static(1, "shape")
    if len(sizes) != len(axes) or len(set(axes)) != len(axes):
        raise ctx.fail(f"shape {sizes} must give one size per axis of {axes} (distinct)")
    if not all(_is_int(dims[a]) for a in axes):
        raise ctx.fail(f"the cropped or padded axes must have static sizes (shape {dims})")
    b = ctx.b
    x = ctx.input(0)
    lengths, starts = list(dims), [0] * rank
    pad = [[0, 0] for _ in range(rank)]
    for a, size in zip(axes, sizes):
        if size < 0:
            raise ctx.fail(f"shape {sizes} holds a negative size")
        diff = int(dims[a]) - size
        if diff > 0:
            lengths[a], starts[a] = size, diff // 2
        elif diff < 0:
            pad[a] = [-diff // 2, -diff - (-diff // 2)]
    if lengths != dims:
        x = b.slice(x, lengths=lengths, starts=starts)
    if any(p != [0, 0] for p in pad):
        x = b.pad(x, ctx.scalar(0, x), pad_width=pad)
    return [x]
