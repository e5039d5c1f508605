"""Elementwise ops against numpy references, run through compiled one-op programs
(and a sample eagerly).

On the CPU, ``mx.compile`` fuses a graph of several elementwise primitives
(a composite op, or a binary op with a broadcast operand) into a C++ kernel
that it compiles on first use, about a second each on a cold kernel cache. So
the compiled tests give binary ops same-shaped operands except where
broadcasting is the point, and the hypothesis test of broadcasting, which would
compile a kernel per shape pattern, runs eagerly.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import mlxprog as mp
from helpers import assert_close, run_op

FAST = settings(max_examples=25, deadline=None)

_erf = np.vectorize(math.erf)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _gelu(x):
    return 0.5 * x * (1 + _erf(x / np.sqrt(2)))


GENERAL = [-2.5, -1.0, -0.5, 0.0, 0.3, 1.0, 2.5]
OPEN_UNIT = [-0.9, -0.5, 0.0, 0.5, 0.9]
POSITIVE = [0.1, 0.5, 1.0, 2.0, 10.0]
AT_LEAST_ONE = [1.0, 1.5, 3.0, 10.0]
NONZERO = [-2.5, -0.5, 0.3, 1.0, 4.0]

# op -> (numpy reference computed in float64, input values)
FLOAT_UNARY = {
    "abs": (np.abs, GENERAL),
    "ceil": (np.ceil, GENERAL),
    "floor": (np.floor, GENERAL),
    "negate": (np.negative, GENERAL),
    "round": (np.round, [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.7]),  # half to even
    "sign": (np.sign, GENERAL),
    "sigmoid": (_sigmoid, GENERAL),
    "asin": (np.arcsin, OPEN_UNIT),
    "asinh": (np.arcsinh, GENERAL),
    "acos": (np.arccos, OPEN_UNIT),
    "acosh": (np.arccosh, AT_LEAST_ONE),
    "atan": (np.arctan, GENERAL),
    "atanh": (np.arctanh, OPEN_UNIT),
    "cos": (np.cos, GENERAL),
    "cosh": (np.cosh, GENERAL),
    "erf": (_erf, GENERAL),
    "erfc": (lambda x: 1 - _erf(x), GENERAL),
    "exp": (np.exp, GENERAL),
    "expm1": (np.expm1, [-1e-6, 1e-7, 0.5, 2.0]),
    "log": (np.log, POSITIVE),
    "log1p": (np.log1p, [1e-7, 0.5, 3.0]),
    "log2": (np.log2, POSITIVE),
    "log10": (np.log10, POSITIVE),
    "rsqrt": (lambda x: 1 / np.sqrt(x), POSITIVE),
    "sin": (np.sin, GENERAL),
    "sinh": (np.sinh, GENERAL),
    "sqrt": (np.sqrt, POSITIVE),
    "square": (np.square, GENERAL),
    "reciprocal": (np.reciprocal, NONZERO),
    "tan": (np.tan, [-1.0, -0.5, 0.0, 0.3, 1.2]),
    "tanh": (np.tanh, GENERAL),
    "cbrt": (np.cbrt, [0.0, 0.001, 8.0, 27.0, 100.0]),
    "silu": (lambda x: x * _sigmoid(x), GENERAL),
    "gelu": (_gelu, GENERAL),
}


def test_every_unary_op_is_covered():
    unary = {
        name for name, spec in mp.all_ops().items()
        if spec.family == "elementwise" and spec.operands == 1
    }
    covered = set(FLOAT_UNARY) | {
        "astype", "bitcast", "is_nan", "is_infinity", "logical_not", "bitwise_not",
        "real", "imag", "conjugate", "erf_inv",
    }
    assert unary <= covered, f"untested: {sorted(unary - covered)}"


@pytest.mark.parametrize("op", sorted(FLOAT_UNARY))
def test_unary_float32(op):
    reference, values = FLOAT_UNARY[op]
    x = np.array(values, np.float32).reshape(-1, 1)
    got = run_op(op, x)
    assert_close(got, reference(x.astype(np.float64)), rtol=2e-5, atol=1e-6, dtype=mx.float32)


@pytest.mark.parametrize("op", ["exp", "sqrt", "tanh", "sigmoid"])
def test_unary_keeps_half_precision(op):
    reference, values = FLOAT_UNARY[op]
    x = np.array([v for v in values if v >= 0], np.float16)
    got = run_op(op, x)
    assert_close(got, reference(x.astype(np.float64)), rtol=2e-3, atol=2e-3, dtype=mx.float16)


def test_erf_inv_inverts_erf():
    x = np.array(OPEN_UNIT, np.float32)
    got = run_op("erf_inv", x)
    assert got.dtype == mx.float32
    assert_close(mx.array(_erf(np.array(got, np.float64))), x, rtol=1e-5, atol=1e-6)


def test_cbrt_is_nan_for_negative_inputs():
    got = run_op("cbrt", np.array([-8.0, -1e-3, 8.0], np.float32))
    assert_close(got, [np.nan, np.nan, 2.0], dtype=mx.float32)


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_documented_special_values_of_sign_and_cbrt(dtype, eager):
    """The op reference's words: sign(NaN) is 0 and sign(-0.0) is +0.0;
    cbrt(-inf) is +inf, cbrt(-0.0) is +0.0, cbrt(NaN) is NaN."""
    x = np.array([np.nan, -0.0, -np.inf, np.inf], dtype)
    sign = np.array(run_op("sign", x, eager=eager))
    np.testing.assert_array_equal(sign, [0, 0, -1, 1])
    assert not np.signbit(sign[1])
    cbrt = np.array(run_op("cbrt", x, eager=eager))
    np.testing.assert_array_equal(cbrt, [np.nan, 0, np.inf, np.inf])
    assert not np.signbit(cbrt[1])


@pytest.mark.parametrize(
    "op, expected_dtype",
    [
        ("abs", mx.int32), ("negate", mx.int32), ("sign", mx.int32), ("square", mx.int32),
        ("sqrt", mx.float32), ("cbrt", mx.float32), ("gelu", mx.float32),
    ],
)
def test_unary_on_integers(op, expected_dtype):
    x = np.array([0, 1, 4, 8, 27], np.int32)
    expected = (np.square(x) if op == "square" else FLOAT_UNARY[op][0](x.astype(np.float64)))
    assert_close(run_op(op, x), expected, rtol=2e-5, atol=1e-6, dtype=expected_dtype)


def test_predicates_give_bool():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, 1.5], np.float32)
    assert_close(run_op("is_nan", x), np.isnan(x), dtype=mx.bool_)
    assert_close(run_op("is_infinity", x), np.isinf(x), dtype=mx.bool_)
    assert_close(run_op("logical_not", np.array([True, False])), [False, True], dtype=mx.bool_)
    assert_close(run_op("is_nan", np.array([1, 2], np.int32)), [False, False], dtype=mx.bool_)


def test_bitwise_not():
    assert_close(run_op("bitwise_not", np.array([0, 5, -1], np.int32)), [-1, -6, 0],
                 dtype=mx.int32)
    assert_close(run_op("bitwise_not", np.array([0, 255], np.uint8)), [255, 0], dtype=mx.uint8)
    assert_close(run_op("bitwise_not", np.array([True, False])), [False, True], dtype=mx.bool_)


def test_complex_parts():
    z = np.array([1 + 2j, -3.5 - 0.5j], np.complex64)
    assert_close(run_op("real", z), z.real, dtype=mx.float32)
    assert_close(run_op("imag", z), z.imag, dtype=mx.float32)
    got = run_op("conjugate", z)
    assert got.dtype == mx.complex64
    np.testing.assert_array_equal(np.array(got), np.conjugate(z))


# Every pair of a column and a row value, as two same-shaped (5, 3) operands.
A, B = (np.ascontiguousarray(v) for v in np.broadcast_arrays(
    np.array([[-7.0, -2.5, 0.0, 3.0, 6.0]], np.float32).T,
    np.array([-3.0, 2.0, 4.0], np.float32),
))

# op -> numpy reference; float32 operands
FLOAT_BINARY = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "atan2": np.arctan2,
    "min": np.minimum,
    "max": np.maximum,
    "quotient": np.floor_divide,
}

COMPARISONS = {
    "equal": np.equal,
    "not_equal": np.not_equal,
    "greater": np.greater,
    "less": np.less,
    "greater_equal": np.greater_equal,
    "less_equal": np.less_equal,
}

LOGIC = {
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
}

INT_BINARY = {
    "add": np.add,
    "multiply": np.multiply,
    "quotient": np.floor_divide,
    "left_shift": np.left_shift,
    "right_shift": np.right_shift,
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "pow": np.power,
}


def test_every_binary_op_is_covered():
    binary = {
        name for name, spec in mp.all_ops().items()
        if spec.family == "elementwise" and spec.operands == 2
    }
    covered = set(FLOAT_BINARY) | set(COMPARISONS) | set(LOGIC) | set(INT_BINARY) | {"remainder"}
    assert binary <= covered, f"untested: {sorted(binary - covered)}"


@pytest.mark.parametrize("op", sorted(FLOAT_BINARY))
def test_binary_float32(op):
    got = run_op(op, A, B)
    assert_close(got, FLOAT_BINARY[op](A.astype(np.float64), B), dtype=mx.float32)


def test_pow_float():
    base = np.array([0.5, 2.0, 9.0], np.float32)
    exponent = np.array([3.0, -1.0, 0.5], np.float32)
    assert_close(run_op("pow", base, exponent), base.astype(np.float64) ** exponent,
                 dtype=mx.float32)


@pytest.mark.parametrize("op", sorted(COMPARISONS))
def test_comparisons_give_bool(op):
    assert_close(run_op(op, A, B), COMPARISONS[op](A, B), dtype=mx.bool_)


@pytest.mark.parametrize("op", sorted(LOGIC))
def test_logic_gives_bool(op):
    p, q = A > 0, B > 0
    assert_close(run_op(op, p, q), LOGIC[op](p, q), dtype=mx.bool_)


def test_comparisons_with_nan():
    a = np.array([np.nan, 1.0, np.nan], np.float32)
    b = np.array([np.nan, np.nan, 1.0], np.float32)
    for op in ("equal", "not_equal", "less", "greater_equal"):
        assert_close(run_op(op, a, b), COMPARISONS[op](a, b), dtype=mx.bool_)


def test_min_max_propagate_nan():
    a = np.array([np.nan, 1.0], np.float32)
    b = np.array([0.0, np.nan], np.float32)
    assert_close(run_op("min", a, b), [np.nan, np.nan])
    assert_close(run_op("max", a, b), [np.nan, np.nan])


@pytest.mark.parametrize("op", sorted(INT_BINARY))
def test_binary_int32(op):
    a, b = (np.ascontiguousarray(v) for v in np.broadcast_arrays(
        np.array([[-9, -1, 0, 5, 12]], np.int32).T, np.array([1, 2, 3], np.int32)))
    if op == "pow":
        a = np.abs(a)
    assert_close(run_op(op, a, b), INT_BINARY[op](a, b), dtype=mx.int32)


def test_right_shift_is_arithmetic_for_signed():
    assert_close(run_op("right_shift", np.array([-8, 8], np.int32), np.array([1, 2], np.int32)),
                 [-4, 2], dtype=mx.int32)


@pytest.mark.parametrize(
    "a_dtype, b_dtype, expected",
    [
        (np.int32, np.float32, mx.float32),
        (np.uint8, np.uint8, mx.uint8),
    ],
)
def test_binary_promotes_like_mlx(a_dtype, b_dtype, expected):
    got = run_op("add", np.array([1, 2], a_dtype), np.array([3, 4], b_dtype))
    assert_close(got, [4, 6], dtype=expected)


def test_integer_divide_gives_float():
    got = run_op("divide", np.array([7, -7], np.int32), np.array([2, 2], np.int32))
    assert_close(got, [3.5, -3.5], dtype=mx.float32)


# --- remainder: truncating (sign of the dividend) ----------------------------------


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_remainder_truncates_with_mixed_signs(dtype):
    a = np.array([7, -7, 7, -7, 6, -6, 6, -6, 0], dtype)
    b = np.array([3, 3, -3, -3, 3, 3, -3, -3, 5], dtype)
    got = run_op("remainder", a, b)
    expected = np.fmod(a, b)
    np.testing.assert_array_equal(expected, [1, -1, 1, -1, 0, 0, 0, 0, 0])
    assert_close(got, expected, dtype=mx.array(a).dtype)


def test_remainder_float_edge_cases():
    a = np.array([-1e-8, -5.0, 5.0, 0.5, np.inf, 3.0], np.float32)
    b = np.array([1.0, np.inf, -np.inf, 0.2, 2.0, 0.0], np.float32)
    with np.errstate(invalid="ignore"):
        expected = np.fmod(a, b)
    assert_close(run_op("remainder", a, b), expected, rtol=1e-6, atol=0, dtype=mx.float32)


def test_integer_division_edge_cases():
    # The most negative value by -1 traps in the CPU's divide instruction.
    lowest = np.iinfo(np.int32).min
    a = np.array([lowest, lowest, lowest, 7, -7, 2**31 - 1], np.int32)
    b = np.array([-1, 3, -2, 0, 0, -2], np.int32)
    assert_close(run_op("quotient", a, b), [lowest, lowest // 3, 2**30, 0, 0, -(2**30)],
                 dtype=mx.int32)
    assert_close(run_op("remainder", a, b), [0, -2, 0, 7, -7, 1], dtype=mx.int32)


def test_remainder_unsigned():
    # Eager: the compiled integer path is covered above, and another dtype would
    # cost another kernel compile.
    a = np.array([7, 6, 255], np.uint8)
    b = np.array([3, 3, 16], np.uint8)
    assert_close(run_op("remainder", a, b, eager=True), np.fmod(a, b), dtype=mx.uint8)


@FAST
@given(st.data())
def test_remainder_matches_fmod(data):
    shape = data.draw(hnp.array_shapes(max_dims=2, max_side=5))
    dtype = data.draw(st.sampled_from([np.int32, np.float32]))
    if dtype == np.int32:
        values = st.integers(-1000, 1000)
        divisors = st.integers(-50, 50).filter(bool)
    else:
        values = st.floats(-1e3, 1e3, width=32)
        divisors = st.floats(-50, 50, width=32).filter(lambda v: abs(v) > 1e-3)
    a = data.draw(hnp.arrays(dtype, shape, elements=values))
    b = data.draw(hnp.arrays(dtype, shape, elements=divisors))
    assert_close(run_op("remainder", a, b), np.fmod(a, b), rtol=1e-5, atol=1e-5)


def test_binary_broadcasts_compiled():
    column = np.array([[1.0], [2.0]], np.float32)
    row = np.array([10.0, 20.0, 30.0], np.float32)
    assert_close(run_op("add", column, row), column + row, dtype=mx.float32)


@FAST
@given(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4), st.data())
def test_arithmetic_broadcasts_like_numpy(shapes, data):
    elements = st.floats(-100, 100, width=32)
    a = data.draw(hnp.arrays(np.float32, shapes.input_shapes[0], elements=elements))
    b = data.draw(hnp.arrays(np.float32, shapes.input_shapes[1], elements=elements))
    for op in ("add", "subtract", "multiply", "max", "min"):
        got = run_op(op, a, b, eager=True)
        assert_close(got, FLOAT_BINARY[op](a, b), dtype=mx.float32)


# --- select, clip, casts -----------------------------------------------------------


def test_select_broadcasts():
    pred = np.array([[True], [False]])
    got = run_op("select", pred, np.array([1.0, 2.0], np.float32), np.float32(-1))
    assert_close(got, np.where(pred, [1.0, 2.0], -1.0), dtype=mx.float32)


def test_clip():
    x = np.array([-3.0, 0.5, 9.0], np.float32)
    got = run_op("clip", x, np.float32(-1), np.float32(2))
    assert_close(got, np.clip(x, -1, 2), dtype=mx.float32)


@pytest.mark.parametrize(
    "values, dtype, expected",
    [
        ([1.7, -1.7, 0.0], "int32", [1, -1, 0]),  # truncates toward zero
        ([1.7, -1.7, 0.0], "bool", [True, True, False]),
        ([1, 2, 300], "float16", [1, 2, 300]),
        ([1.5, 2.25], "bfloat16", [1.5, 2.25]),
    ],
)
def test_astype(values, dtype, expected):
    source = np.array(values, np.float32 if isinstance(values[0], float) else np.int32)
    assert_close(run_op("astype", source, dtype=dtype), expected, dtype=mp.arrays.to_mlx(dtype))


def test_bitcast():
    x = np.array([1.0, -2.0], np.float32)
    assert_close(run_op("bitcast", x, dtype="int32"), x.view(np.int32), dtype=mx.int32)
    assert_close(run_op("bitcast", x, dtype="uint8"), x.view(np.uint8), dtype=mx.uint8)
    packed = np.arange(8, dtype=np.uint8).reshape(2, 4)
    assert_close(run_op("bitcast", packed, dtype="uint32"), packed.view(np.uint32),
                 dtype=mx.uint32)


# --- eager agrees with compiled; invalid instructions ------------------------------


@pytest.mark.parametrize(
    "op, operands, attrs",
    [
        ("gelu", (A,), {}),
        ("remainder", (A, B), {}),
        ("logical_xor", (A > 0, B > 0), {}),
        ("bitcast", (B,), {"dtype": "int32"}),
    ],
)
def test_eager_agrees_with_compiled(op, operands, attrs):
    compiled = run_op(op, *operands, **attrs)
    eager = run_op(op, *operands, eager=True, **attrs)
    np.testing.assert_array_equal(np.array(eager), np.array(compiled))


@pytest.mark.parametrize(
    "op, operands, attrs, message",
    [
        ("astype", (A,), {"dtype": "float8"}, "unknown dtype 'float8'"),
        ("astype", (A,), {}, "attribute 'dtype'"),
        ("exp", (A,), {"axis": 0}, "unknown attribute"),
        ("bitcast", (np.zeros(3, np.uint8),), {"dtype": "int16"}, "multiple"),
        ("add", (np.zeros((2, 3), np.float32), np.zeros(4, np.float32)), {}, "broadcast"),
    ],
)
def test_invalid_instruction_is_named(op, operands, attrs, message):
    with pytest.raises(mp.ValidationError, match="instruction 0") as info:
        run_op(op, *operands, **attrs)
    assert message in str(info.value)
    assert f"({op})" in str(info.value)


@pytest.mark.parametrize("eager", [False, True])
def test_shift_amounts_outside_the_width_shift_every_bit_out(eager):
    x = np.array([7, -8, 1, 3, 2, 100], np.int32)
    for amount, left, right in [(32, [0] * 6, [0, -1, 0, 0, 0, 0]),
                                (40, [0] * 6, [0, -1, 0, 0, 0, 0]),
                                (-1, [0] * 6, [0, -1, 0, 0, 0, 0]),
                                (3, (x << 3).tolist(), (x >> 3).tolist())]:
        s = np.array(amount, np.int32)
        assert np.array(run_op("left_shift", x, s, eager=eager)).tolist() == left
        assert np.array(run_op("right_shift", x, s, eager=eager)).tolist() == right
    unsigned = np.array([2**32 - 1, 5], np.uint32)
    assert np.array(run_op("right_shift", unsigned, np.array(32, np.uint32),
                           eager=eager)).tolist() == [0, 0]


@pytest.mark.parametrize("op", ["round", "floor", "ceil"])
def test_rounding_leaves_64_bit_integers_exact(op):
    b = mp.ProgramBuilder()
    x = b.input("x", (2,), "uint64")
    prog = b.build([b.add(b.op(op, x), b.constant(0, "uint64"))])  # fused with the add
    big = np.array([2**64 - 1, 3], np.uint64)
    assert np.array(mp.run(prog, big)[0]).tolist() == [2**64 - 1, 3]
    assert np.array(run_op(op, np.array([2**63 - 1, -3], np.int64))).tolist() == [2**63 - 1, -3]
