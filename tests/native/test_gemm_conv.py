"""The native float32 matmul and convolution (src/kernels/*/gemm.h,
src/primitives/gemm_conv.cpp) against MLX's own ops and float64 references, on
every kernel table this CPU runs; their use by the ``matmul``, ``dot`` and
``conv_general`` ops, inside mx.compile and shapeless compilation."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from mlxprog import native
from mlxprog.native import kernels

RNG = np.random.default_rng(21)


@pytest.fixture(params=["best", "avx2", "portable"])
def table(request, ext):
    """Each kernel table this CPU runs (the AVX2 one is also tried by name,
    since "best" may be a VNNI table with the same float kernels)."""
    if request.param not in ("best", *ext.isas()):
        pytest.skip(f"no {request.param} table here")
    ext.set_isa(request.param)
    yield request.param
    ext.set_isa("best")


def normal(*shape) -> mx.array:
    return mx.array(RNG.standard_normal(shape).astype(np.float32))


def assert_float32_close(got: mx.array, want: np.ndarray, depth: int) -> None:
    """got against a float64 reference, within float32 rounding of sums of
    `depth` products of normal values (errors grow about as sqrt(depth);
    1e-6 * depth bounds them with room for any summation order)."""
    assert tuple(got.shape) == want.shape, f"shape {got.shape} != {want.shape}"
    assert got.dtype == mx.float32
    if want.size == 0:
        return
    err = np.abs(np.array(got).astype(np.float64) - want).max()
    bound = 2e-6 * max(depth, 1) ** 0.5 * max(np.abs(want).max(), 1.0) + 1e-6 * max(depth, 1)
    assert err <= bound, f"error {err:.2e} > {bound:.2e}"


def f64(a: mx.array) -> np.ndarray:
    return np.array(a).astype(np.float64)


# -- matmul ----------------------------------------------------------------------------------

MATMUL_SHAPES = [
    ((1, 1), (1, 1)),
    ((1, 37), (37, 1)),        # one row, one column
    ((7, 1), (1, 9)),          # K = 1
    ((6, 16), (16, 16)),       # exactly one AVX2 tile
    ((13, 300), (300, 35)),    # edges in every direction, K past one block
    ((150, 257), (257, 4100)),  # past MC, KC and NC
    ((257, 64), (64, 129)),
    ((3, 5, 8), (3, 8, 4)),    # batched
    ((2, 1, 4, 30), (3, 30, 17)),  # batch dims broadcast
    ((4, 30), (5, 30, 6)),     # a 2-D operand against a batch
    ((30,), (30, 6)),          # vectors
    ((5, 30), (30,)),
    ((30,), (30,)),
    ((2, 3, 30), (30,)),
]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul_matches_mlx(table, shapes):
    a, b = normal(*shapes[0]), normal(*shapes[1])
    got = kernels.matmul(native.Setting(True), a, b)
    assert got is not None
    want = mx.matmul(a, b)
    assert got.shape == want.shape
    assert_float32_close(got, np.matmul(f64(a), f64(b)), a.shape[-1])


@pytest.mark.parametrize("shapes", [((0, 4), (4, 5)), ((3, 0), (0, 5)), ((3, 4), (4, 0)),
                                    ((0, 3, 4), (4, 2))], ids=str)
def test_matmul_empty_operands_give_mlx_results(ext, shapes):
    a, b = mx.zeros(shapes[0]), mx.ones(shapes[1])
    got = kernels.matmul(native.Setting(True), a, b)
    want = mx.matmul(a, b)
    assert got.shape == want.shape and mx.array_equal(got, want).item()


def test_matmul_reads_strided_views_in_place(table):
    a, b = normal(40, 65), normal(33, 40)
    cases = [
        (a.T, b.T),                    # both transposed
        (a[::2, 1::3], normal(22, 9)),  # steps in both axes
        (a[:, :40], b.T[:, 5:]),       # row slices
        (mx.broadcast_to(normal(1, 40), (6, 40)), normal(40, 3)),  # stride-0 rows
        (mx.broadcast_to(normal(3, 40), (2, 3, 40)), mx.swapaxes(normal(2, 7, 40), 1, 2)),
    ]
    for x, y in cases:
        got = kernels.matmul(native.Setting(True), x, y)
        assert_float32_close(got, np.matmul(f64(x), f64(y)), x.shape[-1])


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("depth, cols", [(37, 3), (300, 11), (16, 4), (1, 9), (9216, 8)])
def test_matmul_rows_by_a_transposed_weight(table, rows, depth, cols):
    """One or two rows times a ``[N, K]`` weight seen transposed (ONNX's Gemm
    with transB, a linear layer): dot products, four columns at a time and
    the columns left over one by one, every K remainder."""
    w = normal(cols, depth)
    x = normal(rows, depth)
    got = kernels.matmul(native.Setting(True), x, w.T)
    assert_float32_close(got, np.matmul(f64(x), f64(w).T), depth)


def test_matmul_inside_compile_and_shapeless_compile(ext):
    setting = native.Setting(True)

    def f(x, y):
        return kernels.matmul(setting, x, y) * 2.0

    for shapeless in (False, True):
        compiled = mx.compile(f, shapeless=shapeless)
        for rows, depth, cols in ((3, 8, 5), (20, 33, 7), (1, 300, 40)):
            x, y = normal(2, rows, depth), normal(depth, cols)
            assert_float32_close(compiled(x, y), 2 * np.matmul(f64(x), f64(y)), depth)


def test_matmul_covers():
    f32, f16 = mx.float32, mx.float16
    assert kernels.covers_matmul(((2, 3), f32), ((3, 4), f32))
    assert kernels.covers_matmul(((2, 1, 2, 3), f32), ((5, 3, 4), f32))
    assert kernels.covers_matmul(((3,), f32), ((3,), f32))
    assert not kernels.covers_matmul(((2, 3), f16), ((3, 4), f16))  # MLX's op
    assert not kernels.covers_matmul(((2, 3), f32), ((3, 4), mx.int32))
    assert not kernels.covers_matmul(((2, 3), f32), ((4, 4), f32))  # MLX raises
    assert not kernels.covers_matmul(((2, 2, 3), f32), ((3, 3, 4), f32))
    assert not kernels.covers_matmul(((), f32), ((3, 4), f32))


def test_native_matmul_errors_name_the_shapes(ext):
    with pytest.raises(ValueError, match=r"\[2, 3\] and \[4, 5\]"):
        ext.matmul(mx.ones((2, 3)), mx.ones((4, 5)))
    with pytest.raises(ValueError, match="float32"):
        ext.matmul(mx.ones((2, 3), mx.float16), mx.ones((3, 5), mx.float16))


# -- convolution -------------------------------------------------------------------------------

# x shape, w shape, stride, (low, high) padding, kernel dilation, groups
CONV_CASES = [
    ((1, 5, 5, 3), (4, 3, 3, 3), [1, 1], [(1, 1), (1, 1)], [1, 1], 1),
    ((2, 9, 11, 6), (8, 3, 3, 3), [2, 1], [(1, 0), (2, 1)], [1, 2], 2),  # asymmetric
    ((1, 8, 8, 16), (32, 1, 1, 16), [1, 1], [(0, 0), (0, 0)], [1, 1], 1),  # pointwise
    ((1, 8, 8, 16), (32, 1, 1, 16), [2, 2], [(0, 0), (0, 0)], [1, 1], 1),  # strided 1x1
    ((1, 8, 8, 16), (8, 1, 1, 4), [1, 1], [(0, 0), (0, 0)], [1, 1], 4),  # grouped 1x1
    ((2, 12, 10, 7), (7, 3, 3, 1), [1, 1], [(1, 1), (1, 1)], [1, 1], 7),  # depthwise
    ((1, 12, 10, 5), (5, 5, 3, 1), [2, 3], [(2, 0), (0, 3)], [2, 1], 5),
    ((1, 9, 9, 6), (12, 3, 3, 1), [1, 1], [(1, 1), (1, 1)], [1, 1], 6),  # channel multiplier
    ((1, 23, 23, 3), (64, 7, 7, 3), [2, 2], [(3, 3), (3, 3)], [1, 1], 1),  # a ResNet stem
    # spans of taps along the last axis split by the KC slice (K = 294) and the padding
    ((1, 13, 11, 6), (8, 7, 7, 6), [2, 1], [(3, 2), (3, 3)], [1, 1], 1),
    ((1, 9, 12, 3), (5, 3, 5, 3), [1, 2], [(1, 1), (2, 2)], [2, 1], 1),  # dilated first axis
    ((1, 9, 12, 3), (5, 3, 5, 3), [1, 1], [(1, 1), (2, 2)], [1, 2], 1),  # no span: dilated
    ((2, 19, 3), (4, 5, 3), [1], [(2, 2)], [1], 1),  # 1-D spans
    ((1, 14, 14, 300), (20, 3, 3, 300), [1, 1], [(1, 1), (1, 1)], [1, 1], 1),  # K past KC
    ((1, 3, 3, 2), (3, 3, 3, 2), [1, 1], [(0, 0), (0, 0)], [1, 1], 1),  # a 1x1 result
    ((3, 17, 5), (6, 4, 5), [2], [(1, 2)], [2], 1),  # 1-D
    ((2, 17, 6), (6, 3, 2), [1], [(1, 1)], [1], 3),  # 1-D grouped
    ((1, 5, 6, 7, 4), (3, 2, 3, 2, 4), [1, 2, 1], [(1, 0), (0, 1), (1, 1)], [2, 1, 1], 1),  # 3-D
]


def conv_reference(x, w, stride, padding, dilation, groups) -> np.ndarray:
    """conv_general by definition, in float64 (channels last)."""
    x, w = f64(x), f64(w)
    spatial = x.ndim - 2
    x = np.pad(x, [(0, 0), *padding, (0, 0)])
    c_out, c_group = w.shape[0], w.shape[-1]
    kernel = w.shape[1:-1]
    out_sizes = [(x.shape[1 + d] - ((kernel[d] - 1) * dilation[d] + 1)) // stride[d] + 1
                 for d in range(spatial)]
    out = np.zeros((x.shape[0], *out_sizes, c_out))
    per_group = c_out // groups
    for tap in np.ndindex(*kernel):
        window = tuple(slice(t * dl, t * dl + (n - 1) * s + 1, s)
                       for t, dl, n, s in zip(tap, dilation, out_sizes, stride))
        patch = x[(slice(None), *window)]
        for g in range(groups):
            xs = patch[..., g * c_group:(g + 1) * c_group]
            ws = w[(slice(g * per_group, (g + 1) * per_group), *tap)]
            out[..., g * per_group:(g + 1) * per_group] += xs @ ws.T
    return out


def run_native_conv(x, w, stride, padding, dilation, groups):
    got = kernels.conv(native.Setting(True), x, w, stride=stride, padding=padding,
                       kernel_dilation=dilation, input_dilation=[1] * len(stride),
                       groups=groups, flip=False, op="conv_general")
    assert got is not None
    return got


@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_conv_matches_mlx(table, case):
    xs, ws, stride, padding, dilation, groups = case
    x, w = normal(*xs), normal(*ws)
    got = run_native_conv(x, w, stride, padding, dilation, groups)
    want = f64(mx.conv_general(x, w, stride=stride, padding=([lo for lo, _ in padding],
                                                             [hi for _, hi in padding]),
                               kernel_dilation=dilation, groups=groups))
    depth = int(np.prod(ws[1:]))
    assert_float32_close(got, want, depth)
    assert_float32_close(got, conv_reference(x, w, stride, padding, dilation, groups), depth)


@pytest.mark.parametrize("activation", ["none", "relu"])
@pytest.mark.parametrize("case", CONV_CASES, ids=str)
@pytest.mark.parametrize("residual", [False, True], ids=["bias", "bias+residual"])
def test_conv_epilogue_matches_the_definition(table, case, activation, residual):
    """The epilogue (bias per output channel, the residual element by
    element, then the activation) on every path: tiles, clipped edge tiles,
    one or two rows, depthwise, pointwise, groups (each group's slice of the
    bias and the residual)."""
    xs, ws, stride, padding, dilation, groups = case
    x, w, bias = normal(*xs), normal(*ws), normal(ws[0])
    want = conv_reference(x, w, stride, padding, dilation, groups) + f64(bias)
    shortcut = normal(*want.shape) if residual else None
    got = kernels.conv(native.Setting(True), x, w, stride=stride, padding=padding,
                       kernel_dilation=dilation, input_dilation=[1] * len(stride),
                       groups=groups, flip=False, op="conv_general", bias=bias,
                       residual=shortcut, activation=activation)
    if residual:
        want = want + f64(shortcut)
    if activation == "relu":
        want = np.maximum(want, 0.0)
    assert_float32_close(got, want, int(np.prod(ws[1:])))


def test_conv_relu_keeps_nan(table):
    """ReLU of NaN is NaN (as max(x, 0) in NumPy and ONNX), in full tiles,
    edge tiles and the depthwise path alike."""
    x = normal(1, 7, 7, 16)
    x[0, 3, 3, 0] = float("nan")
    for w in (normal(20, 3, 3, 16), normal(16, 3, 3, 1)):
        groups = 16 if w.shape[-1] == 1 else 1
        got = np.array(kernels.conv(native.Setting(True), x, w, stride=[1, 1],
                                    padding=[(1, 1), (1, 1)], kernel_dilation=[1, 1],
                                    input_dilation=[1, 1], groups=groups, flip=False,
                                    op="conv_general", bias=normal(w.shape[0]),
                                    activation="relu"))
        want = np.isnan(conv_reference(x, w, [1, 1], [(1, 1), (1, 1)], [1, 1], groups))
        assert want.any() and (np.isnan(got) == want).all()
        assert (got[~want] >= 0).all()


def test_conv_non_contiguous_operands(table):
    x = mx.transpose(normal(2, 6, 9, 10), (0, 2, 3, 1))  # NCHW data seen as NHWC
    w = mx.transpose(normal(8, 6, 3, 3), (0, 2, 3, 1))
    got = run_native_conv(x, w, [1, 1], [(1, 1), (1, 1)], [1, 1], 1)
    assert_float32_close(got, conv_reference(x, w, [1, 1], [(1, 1), (1, 1)], [1, 1], 1), 54)
    dw = mx.transpose(normal(6, 1, 3, 3), (0, 2, 3, 1))
    got = run_native_conv(x, dw, [2, 2], [(1, 0), (1, 0)], [1, 1], 6)
    assert_float32_close(got, conv_reference(x, dw, [2, 2], [(1, 0), (1, 0)], [1, 1], 6), 9)


def test_conv_covers():
    f32 = mx.float32
    base = dict(stride=[1, 1], padding=[(0, 0), (0, 0)], kernel_dilation=[1, 1],
                input_dilation=[1, 1], groups=1, flip=False)
    x, w = ((1, 5, 5, 4), f32), ((8, 3, 3, 4), f32)
    assert kernels.covers_conv(x, w, **base)
    assert not kernels.covers_conv(x, w, **{**base, "flip": True})
    assert not kernels.covers_conv(x, w, **{**base, "input_dilation": [2, 1]})
    assert not kernels.covers_conv(((1, 5, 5, 4), mx.float16), ((8, 3, 3, 4), mx.float16), **base)
    assert not kernels.covers_conv(((0, 5, 5, 4), f32), w, **base)  # empty: MLX's op
    assert not kernels.covers_conv(((1, 2, 5, 4), f32), w, **base)  # no output rows
    assert not kernels.covers_conv(x, ((8, 3, 3, 3), f32), **base)  # channels mismatch
    # groups with 3 spatial dims stay MLX's (which raises).
    x3, w3 = ((1, 4, 4, 4, 4), f32), ((4, 1, 1, 1, 2), f32)
    args3 = dict(stride=[1] * 3, padding=[(0, 0)] * 3, kernel_dilation=[1] * 3,
                 input_dilation=[1] * 3, flip=False)
    assert not kernels.covers_conv(x3, w3, groups=2, **args3)


# -- the ops ---------------------------------------------------------------------------------


def test_ops_take_the_native_kernels(ext):
    b = mp.ProgramBuilder("cnn")
    x = b.input("x", (1, 12, 12, 8), "float32")
    w = b.input("w", (16, 3, 3, 8), "float32")
    m = b.input("m", (16, 10), "float32")
    y = b.conv_general(x, w, stride=[2, 2], padding=[(1, 1), (1, 1)])
    z = b.matmul(b.reshape(y, shape=[36, 16]), m)
    d = b.dot(z, m, lhs_contracting_axes=[1], rhs_contracting_axes=[1])
    prog = b.build([y, z, d])
    xv, wv, mv = normal(1, 12, 12, 8), normal(16, 3, 3, 8), normal(16, 10)
    results = {}
    for flag in (True, False):
        exe = mp.compile(prog, native=flag)
        results[flag] = exe(xv, wv, mv)
        expected = {"conv_general": 1, "matmul": 1, "dot": 1} if flag else {}
        assert exe.stats.native_ops == expected
    for got, want in zip(results[True], results[False]):
        assert_float32_close(got, f64(want), 72 * 16)


@pytest.mark.parametrize("groups", [1, 2, 8])
@pytest.mark.parametrize("residual", [False, True], ids=["bias", "bias+residual"])
def test_conv_general_op_epilogue(ext, groups, residual):
    """``conv_general`` with a bias (and residual) operand and
    ``activation="relu"``: the native kernel's fused epilogue and MLX's ops
    agree with the definition."""
    b = mp.ProgramBuilder("conv_relu")
    x = b.input("x", (2, 9, 9, 8), "float32")
    w = b.input("w", (16, 3, 3, 8 // groups), "float32")
    operands = [x, w, b.input("bias", (16,), "float32")]
    if residual:
        operands.append(b.input("shortcut", (2, 9, 9, 16), "float32"))
    y = b.conv_general(*operands, padding=[(1, 1), (1, 1)], groups=groups, activation="relu")
    prog = b.build([y])
    args = [normal(2, 9, 9, 8), normal(16, 3, 3, 8 // groups), normal(16), normal(2, 9, 9, 16)]
    args = args[:len(operands)]
    want = conv_reference(args[0], args[1], [1, 1], [(1, 1), (1, 1)], [1, 1], groups)
    want = np.maximum(want + sum(f64(a) for a in args[2:]), 0.0)
    for flag in (True, False):
        exe = mp.compile(prog, native=flag)
        assert_float32_close(exe(*args)[0], want, 72)
        assert exe.stats.native_ops == ({"conv_general": 1} if flag else {})


@pytest.mark.parametrize("bias_shape, dtype", [((15,), "float32"), ((16, 1), "float32"),
                                               ((16,), "float16")])
def test_conv_general_rejects_a_bad_bias(bias_shape, dtype):
    b = mp.ProgramBuilder("bad_bias")
    x = b.input("x", (1, 5, 5, 4), "float32")
    w = b.input("w", (16, 3, 3, 4), "float32")
    bias = b.input("bias", bias_shape, dtype)
    with pytest.raises(mp.ProgramError, match=r"conv_general.*bias \(operand 2\) must be "
                                              r"\[C_out\] = \[16\]"):
        b.conv_general(x, w, bias)


@pytest.mark.parametrize("shape, dtype", [((1, 5, 5, 16), "float32"), ((1, 3, 3, 16), "float16"),
                                          ((1, 3, 3, 8), "float32")])
def test_conv_general_rejects_a_bad_residual(shape, dtype):
    b = mp.ProgramBuilder("bad_residual")
    x = b.input("x", (1, 5, 5, 4), "float32")
    w = b.input("w", (16, 3, 3, 4), "float32")
    bias = b.input("bias", (16,), "float32")
    z = b.input("z", shape, dtype)
    with pytest.raises(mp.ProgramError, match=r"residual \(operand 3\) must have the result's "
                                              r"shape \[1, 3, 3, 16\]"):
        b.conv_general(x, w, bias, z)


def test_matmul_op_stays_shapeless_with_native_kernels(ext):
    b = mp.ProgramBuilder("f32_matmul")
    b.dim("T", max=64)
    x = b.input("x", (3, "T"), "float32")
    y = b.input("y", ("T", 2), "float32")
    exe = mp.compile(b.build([b.matmul(x, y)]), native=True)
    for length in (2, 7, 50):
        lhs, rhs = normal(3, length), normal(length, 2)
        assert_float32_close(exe(lhs, rhs)[0], np.matmul(f64(lhs), f64(rhs)), length)
    assert exe.stats.traces == 1
    assert exe.stats.as_dict()["shapeless_segments"] == 1
    assert exe.stats.native_ops == {"matmul": 1}


def test_no_native_matmul_or_conv_off_the_cpu(ext, monkeypatch):
    on = native.Setting(True)
    monkeypatch.setattr(native.mx, "default_device", lambda: mx.Device(mx.gpu))
    assert kernels.matmul(on, mx.ones((2, 3)), mx.ones((3, 2))) is None
    assert kernels.conv(on, mx.ones((1, 3, 3, 1)), mx.ones((1, 1, 1, 1)), stride=[1, 1],
                        padding=[(0, 0), (0, 0)], kernel_dilation=[1, 1],
                        input_dilation=[1, 1], groups=1, flip=False, op="conv_general") is None
    assert on.counts == {}


def test_inspect_coverage_rules_match_the_kernels():
    """The ops' native_coverage rules (what ``mlxprog inspect`` reports)."""
    from mlxprog.arrays import AVal

    f32 = mx.float32
    conv = mp.lookup("conv_general")
    attrs = conv.attrs(stride=[2, 2], padding=[(1, 1), (1, 1)])
    assert conv.native_coverage([AVal((1, 8, 8, 4), f32), AVal((8, 3, 3, 4), f32)], attrs)
    assert not conv.native_coverage([AVal((1, 8, 8, 4), f32), AVal((8, 3, 3, 4), f32)],
                                    conv.attrs(input_dilation=[2, 2]))
    matmul = mp.lookup("matmul")
    assert matmul.native_coverage([AVal((3, 4), f32), AVal((4, 5), f32)], None)
    assert not matmul.native_coverage([AVal((3, 4), mx.float16), AVal((4, 5), mx.float16)],
                                      None)
    dot = mp.lookup("dot")
    dot_attrs = dot.attrs(lhs_contracting_axes=[1], rhs_contracting_axes=[0])
    assert dot.native_coverage([AVal((3, 4), f32), AVal((4, 5), f32)], dot_attrs)
    # Integers take the exact integer kernel; bool has none.
    assert dot.native_coverage([AVal((3, 4), mx.int32), AVal((4, 5), mx.int32)], dot_attrs)
    assert not dot.native_coverage([AVal((3, 4), mx.bool_), AVal((4, 5), mx.bool_)], dot_attrs)
    tensordot = mp.lookup("tensordot")
    assert tensordot.native_coverage([AVal((3, 4), f32), AVal((4, 5), f32)],
                                     tensordot.attrs(axes=1))


def test_kept_weight_packings_follow_the_weight_and_the_table(ext):
    """Weights packed once are kept across calls (keyed by the weight's
    buffer, view and kernel table): alternating weights of one shape, views
    of one buffer, and kernel tables each get their own packing."""
    x = normal(1, 10, 10, 16)
    w1, w2 = normal(24, 3, 3, 16), normal(24, 3, 3, 16)
    base = normal(24, 16, 3, 3)
    views = [mx.transpose(base, (0, 2, 3, 1)), mx.transpose(base, (0, 3, 2, 1))]
    args = ([1, 1], [(1, 1), (1, 1)], [1, 1], 1)
    for table_name in ("best", "portable", "best"):
        ext.set_isa(table_name)
        for w in (w1, w2, w1, *views, *views):
            assert_float32_close(run_native_conv(x, w, *args), conv_reference(x, w, *args), 144)
        m1, m2 = normal(64, 40), normal(64, 40)
        for m in (m1, m2, m1, m1.T.T):
            a = normal(9, 64)
            got = kernels.matmul(native.Setting(True), a, m)
            assert_float32_close(got, f64(a) @ f64(m), 64)
    ext.set_isa("best")
