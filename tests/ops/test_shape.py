"""Shape and movement ops against numpy references, run through compiled one-op
programs (and a sample eagerly)."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import mlxprog as mp
from mlxprog.arrays import AVal
from helpers import assert_close, assert_invalid, one_op_program, run_op

FAST = settings(max_examples=25, deadline=None)

X = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)


def validated_attrs(op, *operands, **attrs):
    """The attrs of a one-op program's instruction after validation."""
    return mp.validate(one_op_program(op, *operands, **attrs)).block.steps[0].attrs


# --- attributes alone, operand checks -------------------------------------------------


@pytest.mark.parametrize(
    "op, attrs",
    [("reshape", {"shape": [5, 4]}), ("transpose", {"axes": [1, 0]}),
     ("broadcast", {"shape": [2, 3], "axes": [1]}), ("pad", {"pad_width": [[-9, 0]]})],
)
def test_attrs_validate_without_operands(op, attrs):
    # The models check attributes only (docs and the schema read them so); the
    # op's check rule sees the operands.
    spec = mp.lookup(op)
    validated = spec.attrs.model_validate(attrs)
    avals = [AVal((2, 3, 4), mx.float32), AVal((), mx.float32)][: spec.operand_range()[0]]
    with pytest.raises(ValueError):
        spec.check(avals, validated)


# --- reshape, squeeze, expand_dims, transpose, flatten -----------------------------


@pytest.mark.parametrize("shape", [[4, 6], [-1, 4], [2, -1, 2, 3], [24], [1, 24, 1]])
def test_reshape(shape):
    assert_close(run_op("reshape", X, shape=shape), X.reshape(shape), dtype=mx.float32)


def test_reshape_to_and_from_scalar():
    one = np.array([[7]], np.int32)
    assert_close(run_op("reshape", one, shape=[]), np.int32(7), dtype=mx.int32)
    assert_close(run_op("reshape", np.int32(7), shape=[1, -1]), one, dtype=mx.int32)


@FAST
@given(hnp.arrays(np.int32, hnp.array_shapes(max_dims=4, max_side=4)))
def test_reshape_reversed_shape(x):
    target = list(reversed(x.shape))
    assert_close(run_op("reshape", x, shape=target), x.reshape(target), dtype=mx.int32)


def test_reshape_invalid():
    assert_invalid("attribute 'shape': cannot reshape [2, 3, 4] (24 elements) into [5, 4] "
                   "(20 elements)", "reshape", X, shape=[5, 4])
    assert_invalid("into [5, -1]: no size for the -1 makes 24 elements", "reshape", X,
                   shape=[5, -1])
    assert_invalid("into [0, -1]", "reshape", X, shape=[0, -1])
    assert_invalid("more than one -1", "reshape", X, shape=[-1, -1])
    assert_invalid("attribute 'shape.0'", "reshape", X, shape=[-2, 12])


@pytest.mark.parametrize("axes", [None, [0], [-1], [0, 3]])
def test_squeeze(axes):
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 3, 1)
    expected = np.squeeze(x, axis=None if axes is None else tuple(axes))
    attrs = {} if axes is None else {"axes": axes}
    assert_close(run_op("squeeze", x, **attrs), expected, dtype=mx.float32)


def test_squeeze_invalid():
    assert_invalid("Cannot squeeze axis 1", "squeeze", X[None], axes=[1])
    assert_invalid("axis 3 is out of range for an operand of rank 3", "squeeze", X, axes=[3])


@pytest.mark.parametrize("axes", [[0], [-1], [0, -1], [1, 2], [4, 0]])
def test_expand_dims(axes):
    assert_close(run_op("expand_dims", X, axes=axes), np.expand_dims(X, tuple(axes)))


def test_expand_dims_invalid():
    assert_invalid("axis 5 is out of range for a result of rank 5", "expand_dims", X, axes=[0, 5])
    assert_invalid("name an axis twice", "expand_dims", X, axes=[0, -5])


@pytest.mark.parametrize("axes", [None, [0, 1, 2], [2, 0, 1], [-1, 0, -2]])
def test_transpose(axes):
    expected = np.transpose(X, None if axes is None else axes)
    attrs = {} if axes is None else {"axes": axes}
    assert_close(run_op("transpose", X, **attrs), expected, dtype=mx.float32)


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("shape", [[2, 3, 4], [2, "T", 4]])
def test_transpose_axes_null_reverses(shape, eager):
    # An explicit null (the documented default) read from a program file.
    text = json.dumps({
        "format": "mlxprog", "version": 1, "dims": {"T": {}} if "T" in shape else {},
        "inputs": [{"name": "x", "shape": shape, "dtype": "float32"}],
        "instructions": [{"op": "transpose", "operands": [{"input": 0}],
                          "attrs": {"axes": None}}],
        "outputs": [{"result": 0}],
    })
    (got,) = mp.run(mp.Program.loads(text), mx.array(X), eager=eager)
    assert_close(got, np.transpose(X), dtype=mx.float32)


@FAST
@given(st.permutations(range(4)))
def test_transpose_permutations(perm):
    x = np.arange(2 * 3 * 1 * 5, dtype=np.int16).reshape(2, 3, 1, 5)
    assert_close(run_op("transpose", x, axes=list(perm)), np.transpose(x, perm), dtype=mx.int16)


def test_transpose_invalid():
    assert_invalid("attribute 'axes': axes [1, 0] must be a permutation of all 3 axes",
                   "transpose", X, axes=[1, 0])
    assert_invalid("name an axis twice", "transpose", X, axes=[0, 0, 1])


@pytest.mark.parametrize(
    "start_axis, end_axis, shape",
    [(0, -1, (24,)), (1, 2, (2, 12)), (0, 1, (6, 4)), (-2, -1, (2, 12)), (1, 1, (2, 3, 4))],
)
def test_flatten(start_axis, end_axis, shape):
    got = run_op("flatten", X, start_axis=start_axis, end_axis=end_axis)
    assert_close(got, X.reshape(shape), dtype=mx.float32)


def test_flatten_defaults_and_scalar():
    assert_close(run_op("flatten", X), X.reshape(-1))
    assert_close(run_op("flatten", np.float32(3)), [3.0], dtype=mx.float32)


def test_flatten_invalid():
    assert_invalid("start_axis must be less than or equal to end_axis", "flatten", X,
                   start_axis=2, end_axis=0)
    assert_invalid("axis 3 is out of range", "flatten", X, end_axis=3)


# --- broadcast, broadcast_to --------------------------------------------------------


def np_broadcast_in_dim(x, shape, axes):
    """Result element at ``index`` is operand element ``index[axes[i]]`` along axis
    i (0 along a size-1 operand axis)."""
    out = np.empty(shape, x.dtype)
    for index in np.ndindex(*shape):
        out[index] = x[tuple(0 if x.shape[i] == 1 else index[a] for i, a in enumerate(axes))]
    return out


@pytest.mark.parametrize(
    "operand_shape, shape, axes",
    [
        ((3,), [2, 3], [1]),
        ((3,), [3, 2], [0]),
        ((2, 3), [2, 4, 3], [0, 2]),
        ((3, 2), [2, 4, 3], [2, 0]),  # axes out of order: a transposition
        ((1, 3), [5, 3], [0, -1]),  # size-1 operand axis broadcasts
        ((), [2, 2], []),
    ],
)
def test_broadcast(operand_shape, shape, axes):
    x = np.arange(int(np.prod(operand_shape)), dtype=np.int32).reshape(operand_shape)
    expected = np_broadcast_in_dim(x, shape, [a % len(shape) for a in axes])
    assert_close(run_op("broadcast", x, shape=shape, axes=axes), expected, dtype=mx.int32)


@FAST
@given(st.data())
def test_broadcast_places_axes(data):
    shape = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))
    axes = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, max_size=len(shape)))
    operand_shape = [data.draw(st.sampled_from([1, shape[a]])) for a in axes]
    x = np.arange(int(np.prod(operand_shape)), dtype=np.float32).reshape(operand_shape)
    got = run_op("broadcast", x, shape=shape, axes=axes)
    assert_close(got, np_broadcast_in_dim(x, shape, axes), dtype=mx.float32)


def test_broadcast_normalises_axes():
    attrs = validated_attrs("broadcast", np.zeros((3,), np.float32), shape=[2, 3], axes=[-1])
    assert attrs.axes == (1,)


def test_broadcast_invalid():
    x = np.zeros((3, 2), np.float32)
    assert_invalid("operand axis 1 (size 2) cannot broadcast to result axis 2 (size 4)",
                   "broadcast", x, shape=[2, 3, 4], axes=[1, 2])
    assert_invalid("one result axis per operand axis", "broadcast", x, shape=[2, 3, 4], axes=[1])
    assert_invalid("axis 3 is out of range for a result of rank 3", "broadcast", x,
                   shape=[2, 3, 4], axes=[1, 3])
    assert_invalid("name an axis twice", "broadcast", x, shape=[3, 3], axes=[0, -2])
    assert_invalid("attribute 'shape.0'", "broadcast", x, shape=[-1, 2], axes=[0, 1])


@pytest.mark.parametrize("shape", [[2, 3, 4], [5, 2, 3, 4], [2, 1, 4]])
def test_broadcast_to(shape):
    x = X[:, :1, :] if shape[-2] == 1 else X
    assert_close(run_op("broadcast_to", x, shape=shape), np.broadcast_to(x, shape))


def test_broadcast_to_from_size_one():
    x = np.array([[1.5], [2.5]], np.float16)
    assert_close(run_op("broadcast_to", x, shape=[2, 3]), np.broadcast_to(x, (2, 3)),
                 dtype=mx.float16)


def test_broadcast_to_invalid():
    assert_invalid("cannot be broadcast", "broadcast_to", X, shape=[3, 3, 4])


# --- pad -------------------------------------------------------------------------------


def np_pad(x, value, pad_width):
    """XLA pad without interior padding: result index j on an axis holds operand
    index j - low when that is in range, else the pad value."""
    shape = [low + size + high for (low, high), size in zip(pad_width, x.shape)]
    out = np.full(shape, value, x.dtype)
    for index in np.ndindex(*shape):
        source = tuple(j - low for j, (low, _) in zip(index, pad_width))
        if all(0 <= s < size for s, size in zip(source, x.shape)):
            out[index] = x[source]
    return out


@pytest.mark.parametrize(
    "pad_width",
    [
        [[1, 2], [0, 0], [3, 0]],
        [[0, 0], [-1, 0], [0, -2]],
        [[-1, 1], [2, -2], [-4, 1]],  # the last axis is cropped away and refilled
        [[0, 0], [0, 0], [0, 0]],
        [[-2, 0], [0, 0], [0, 0]],  # crops the first axis to nothing
    ],
)
def test_pad(pad_width):
    got = run_op("pad", X, np.float32(-1), pad_width=pad_width)
    assert_close(got, np_pad(X, -1, pad_width), dtype=mx.float32)


def test_pad_grows_a_side_and_crops_past_the_data():
    x = np.array([1, 2], np.int32)
    got = run_op("pad", x, np.int32(9), pad_width=[[-3, 2]])
    assert_close(got, np_pad(x, 9, [[-3, 2]]), dtype=mx.int32)
    assert_close(got, [9], dtype=mx.int32)


@FAST
@given(st.data())
def test_pad_matches_xla_semantics(data):
    x = data.draw(hnp.arrays(np.int32, hnp.array_shapes(max_dims=3, max_side=4),
                             elements=st.integers(-100, 100)))
    pad_width = []
    for size in x.shape:
        low = data.draw(st.integers(-size, 3))
        high = data.draw(st.integers(-(size + low) if size + low > 0 else 0, 3))
        pad_width.append([low, high])
    got = run_op("pad", x, np.int32(7), pad_width=pad_width)
    assert_close(got, np_pad(x, 7, pad_width), dtype=mx.int32)


def test_pad_value_is_cast_to_the_operand_dtype():
    got = run_op("pad", X.astype(np.float16), np.float32(0.5), pad_width=[[1, 0], [0, 0], [0, 0]])
    assert_close(got, np_pad(X.astype(np.float16), 0.5, [[1, 0], [0, 0], [0, 0]]),
                 dtype=mx.float16)


def test_pad_invalid():
    value = np.float32(0)
    assert_invalid("one [low, high] pair per operand axis (3), found 2", "pad", X, value,
                   pad_width=[[1, 1], [1, 1]])
    assert_invalid("[-3, -2] on axis 2 of size 4 crops more than the axis holds", "pad", X,
                   value, pad_width=[[0, 0], [0, 0], [-3, -2]])
    assert_invalid("the pad value must be a scalar", "pad", X, np.zeros(2, np.float32),
                   pad_width=[[0, 0], [0, 0], [0, 0]])
    assert_invalid("attribute 'pad_width.0'", "pad", X, value,
                   pad_width=[[1, 1, 0], [0, 0], [0, 0]])  # no interior padding


# --- reverse, concatenate, stack, split --------------------------------------------


@pytest.mark.parametrize("axes", [[0], [2], [-1, 0], [0, 1, 2], []])
def test_reverse(axes):
    assert_close(run_op("reverse", X, axes=axes), np.flip(X, axis=tuple(axes)), dtype=mx.float32)


def test_reverse_invalid():
    assert_invalid("out of range", "reverse", X, axes=[3])
    assert_invalid("name an axis twice", "reverse", X, axes=[2, -1])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concatenate(axis):
    parts = [X, X + 100, X[:1, :1, :1].repeat(2, 0).repeat(3, 1).repeat(4, 2)]
    got = run_op("concatenate", *parts, axis=axis)
    assert_close(got, np.concatenate(parts, axis=axis), dtype=mx.float32)


def test_concatenate_one_operand_and_uneven_sizes():
    assert_close(run_op("concatenate", X, axis=1), X)
    a, b = X[:, :1], X[:, 1:]
    assert_close(run_op("concatenate", b, a, axis=1), np.concatenate([b, a], axis=1))


def test_concatenate_promotes():
    got = run_op("concatenate", np.array([1, 2], np.int32), np.array([0.5], np.float32))
    assert_close(got, [1.0, 2.0, 0.5], dtype=mx.float32)


def test_concatenate_invalid():
    assert_invalid("must match exactly except for the concatenation axis", "concatenate",
                   X, X[:, :2], axis=0)
    assert_invalid("axis -4 is out of range", "concatenate", X, X, axis=-4)


@pytest.mark.parametrize("axis", [0, 1, 3, -1, -4])
def test_stack(axis):
    got = run_op("stack", X, X * 2, X * 3, axis=axis)
    assert_close(got, np.stack([X, X * 2, X * 3], axis=axis), dtype=mx.float32)


def test_stack_invalid():
    assert_invalid("axis 4 is out of range for an operand of rank 4", "stack", X, X, axis=4)
    assert_invalid("same shape", "stack", X, X[:1])


@pytest.mark.parametrize(
    "indices_or_sections, axis",
    [(2, 0), (3, 1), (4, -1), (1, 2), ([1], 1), ([1, 3], -1), ([0, 2, 2, 9], 2)],
)
def test_split(indices_or_sections, axis):
    got = run_op("split", X, indices_or_sections=indices_or_sections, axis=axis)
    expected = np.split(X, indices_or_sections, axis=axis)
    assert isinstance(got, list) and len(got) == len(expected)
    for part, reference in zip(got, expected):
        assert_close(part, reference, dtype=mx.float32)


def test_split_output_count_follows_attrs():
    spec = mp.lookup("split")
    assert spec.num_outputs(validated_attrs("split", X, indices_or_sections=3, axis=1), 1) == 3
    assert spec.num_outputs(validated_attrs("split", X, indices_or_sections=[1, 2]), 1) == 3


def test_split_invalid():
    assert_invalid("does not result in sub arrays with equal size", "split", X,
                   indices_or_sections=3, axis=2)
    assert_invalid("at least 1", "split", X, indices_or_sections=0)
    assert_invalid("out of range", "split", X, indices_or_sections=2, axis=3)


# --- normalisation, eager ----------------------------------------------------------


@pytest.mark.parametrize(
    "op, attrs, field, expected",
    [
        ("squeeze", {"axes": [-1]}, "axes", (3,)),
        ("expand_dims", {"axes": [-1, 0]}, "axes", (4, 0)),
        ("transpose", {"axes": [-1, 0, 1]}, "axes", (2, 0, 1)),
        ("reverse", {"axes": [-3]}, "axes", (0,)),
        ("concatenate", {"axis": -1}, "axis", 2),
        ("stack", {"axis": -1}, "axis", 3),
        ("split", {"indices_or_sections": 2, "axis": -1}, "axis", 2),
        ("flatten", {}, "end_axis", 2),
    ],
)
def test_negative_axes_are_normalised(op, attrs, field, expected):
    x = X[..., None] if op == "squeeze" else X
    assert getattr(validated_attrs(op, x, **attrs), field) == expected


@pytest.mark.parametrize(
    "op, operands, attrs",
    [
        ("broadcast", (X[0],), {"shape": [4, 3, 2], "axes": [1, 0]}),
        ("pad", (X, np.float32(5)), {"pad_width": [[1, -1], [0, 2], [-2, 0]]}),
        ("reverse", (X,), {"axes": [1]}),
        ("split", (X,), {"indices_or_sections": [1, 3], "axis": 2}),
    ],
)
def test_eager_agrees_with_compiled(op, operands, attrs):
    compiled = run_op(op, *operands, **attrs)
    eager = run_op(op, *operands, eager=True, **attrs)
    for c, e in zip(*(r if isinstance(r, list) else [r] for r in (compiled, eager))):
        np.testing.assert_array_equal(np.array(e), np.array(c))



# --- shapeless ops -------------------------------------------------------------------

# Every op of the shape, reduce, contract and creation families registered as
# shapeless: its operand shapes (with dim T) and attributes.
SHAPELESS_CASES = {
    "expand_dims": ([("T", 3)], {"axes": [0, -1]}),
    "transpose": ([(2, "T", 3)], {"axes": [1, 2, 0]}),
    "concatenate": ([("T", 3), ("T", 2)], {"axis": 1}),
    "stack": ([("T", 3), ("T", 3)], {"axis": -1}),
    "flatten": ([(2, "T", 3)], {"start_axis": 1}),
    "sum": ([("T", 3)], {"axes": [0]}),
    "product": ([("T", 3)], {"axes": [0], "keepdims": True}),
    "mean": ([("T", 3)], {}),
    "all": ([("T", 3)], {"axes": [1]}),
    "any": ([("T", 3)], {}),
    "reduce_max": ([("T", 3)], {"axes": [0]}),
    "reduce_min": ([("T", 3)], {"axes": [-1]}),
    "var": ([("T", 3)], {"axes": [0], "ddof": 1}),
    "std": ([("T", 3)], {}),
    "argmax": ([("T", 3)], {"axis": 0}),
    "argmin": ([("T", 3)], {}),
    "cumulative_sum": ([("T", 3)], {"axis": 0, "reverse": True}),
    "cumulative_product": ([("T", 3)], {}),
    "cumulative_min": ([("T", 3)], {"axis": 0, "inclusive": False}),
    "cumulative_max": ([("T", 3)], {"axis": 1}),
    "softmax": ([("T", 3)], {"axes": [0]}),
    "matmul": ([("T", 3), (3, "T")], {}),
    "iota": ([], {"shape": [2, 3], "axis": 1}),
    "full": ([], {"shape": [2], "dtype": "float32", "value": "inf"}),
    "arange": ([], {"start": 1, "stop": 4}),
}


def test_shapeless_cases_cover_every_shapeless_op():
    families = {"shape", "reduce", "contract", "creation"}
    shapeless = {
        name for name, spec in mp.all_ops().items() if spec.family in families and spec.shapeless
    }
    assert shapeless == set(SHAPELESS_CASES)


@pytest.mark.parametrize("op", sorted(SHAPELESS_CASES))
def test_shapeless_op_serves_every_length_with_one_trace(op):
    shapes, attrs = SHAPELESS_CASES[op]
    b = mp.ProgramBuilder(op)
    b.dim("T", max=16)
    x = b.input("x", ("T",), "float32")  # binds T even for ops without operands
    operands = [b.input(f"x{i}", shape, "float32") for i, shape in enumerate(shapes)]
    exe = mp.compile(b.build([b.op(op, *operands, **attrs), x]))
    rng = np.random.default_rng(3)
    for length in (2, 5):
        arrays = [rng.standard_normal([length if d == "T" else d for d in shape])
                  .astype(np.float32) for shape in shapes]
        got = exe(np.zeros(length, np.float32), *arrays)[0]
        expected = run_op(op, *arrays, eager=True, **attrs)
        np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-6)
    assert exe.stats.traces == 1
    assert exe.stats.as_dict()["shapeless_segments"] == 1
