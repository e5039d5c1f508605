"""Random ops: determinism under explicit keys (compiled and eager), and
distributions within generous statistical bounds."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from helpers import one_op_program, run_op

KEY = mx.random.key(42)
OTHER_KEY = mx.random.key(43)
N = 20_000


def test_random_key_is_mlx_key():
    key = run_op("random_key", seed=2**40 + 5)
    assert key.dtype == mx.uint32 and key.shape == (2,)
    np.testing.assert_array_equal(np.array(key), np.array(mx.random.key(2**40 + 5)))


def test_random_split_gives_distinct_keys_matching_mlx():
    keys = run_op("random_split", KEY, num=3)
    assert len(keys) == 3
    expected = np.array(mx.random.split(KEY, num=3))
    np.testing.assert_array_equal(np.stack([np.array(k) for k in keys]), expected)
    assert len({tuple(np.array(k)) for k in [*keys, KEY]}) == 4


@pytest.mark.parametrize(
    ("op", "operands", "attrs"),
    [
        ("random_uniform", [], {"shape": [64]}),
        ("random_normal", [], {"shape": [8, 8]}),
        ("random_categorical", [np.zeros((16, 5), np.float32)], {"num_samples": 4}),
        ("random_bernoulli", [], {"shape": [64]}),
        ("random_bernoulli", [np.full((64,), 0.5, np.float32)], {}),
    ],
)
def test_same_key_same_values_different_key_different_values(op, operands, attrs):
    exe = mp.compile(one_op_program(op, KEY, *operands, **attrs))
    first = np.array(exe(KEY, *operands)[0])
    again = np.array(exe(KEY, *operands)[0])
    eager = np.array(run_op(op, KEY, *operands, eager=True, **attrs))
    other = np.array(exe(OTHER_KEY, *operands)[0])
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, eager)
    assert not np.array_equal(first, other)
    assert exe.stats.traces == 1


def test_uniform_stays_in_bounds():
    x = run_op("random_uniform", KEY, shape=[N], low=-2.0, high=3.0)
    assert x.dtype == mx.float32 and x.shape == (N,)
    values = np.array(x)
    assert values.min() >= -2.0 and values.max() < 3.0
    assert abs(values.mean() - 0.5) < 0.1
    assert abs(values.std() - 5 / 12**0.5) < 0.1


def test_uniform_dtype():
    assert run_op("random_uniform", KEY, shape=[3], dtype="float16").dtype == mx.float16


def test_normal_mean_and_std():
    x = run_op("random_normal", KEY, shape=[N], loc=3.0, scale=2.0)
    values = np.array(x)
    assert x.dtype == mx.float32
    assert abs(values.mean() - 3.0) < 0.1
    assert abs(values.std() - 2.0) < 0.1


def test_categorical_follows_logits():
    probs = np.array([0.1, 0.2, 0.7], np.float32)
    logits = np.log(probs)[None].repeat(2, axis=0)
    samples = run_op("random_categorical", KEY, logits, num_samples=N // 2)
    assert samples.dtype == mx.uint32 and samples.shape == (2, N // 2)
    freq = np.bincount(np.array(samples).ravel(), minlength=3) / N
    np.testing.assert_allclose(freq, probs, atol=0.02)


def test_categorical_axis_and_shape():
    logits = np.log(np.array([[0.9, 0.0], [0.1, 1.0]], np.float32) + 1e-9)
    samples = run_op("random_categorical", KEY, logits, axis=0, shape=[1000, 2])
    assert samples.shape == (1000, 2)
    # Column 0 picks row 0 with probability 0.9; column 1 always picks row 1.
    values = np.array(samples)
    assert np.all(values[:, 1] == 1)
    assert abs(np.mean(values[:, 0] == 0) - 0.9) < 0.05


def test_bernoulli_with_p_attribute_and_operand():
    flips = np.array(run_op("random_bernoulli", KEY, p=0.3, shape=[N]))
    assert flips.dtype == np.bool_
    assert abs(flips.mean() - 0.3) < 0.02
    p = np.array([0.0, 1.0, 0.0, 1.0], np.float32)
    draws = run_op("random_bernoulli", KEY, p, shape=[5, 4])
    np.testing.assert_array_equal(np.array(draws), np.broadcast_to(p.astype(bool), (5, 4)))


@pytest.mark.parametrize(
    ("op", "operands", "attrs", "message"),
    [
        ("random_uniform", [np.zeros(3, np.uint32)], {}, "uint32[2] key"),
        ("random_normal", [np.zeros(2, np.int32)], {}, "found int32[2]"),
        ("random_uniform", [KEY], {"dtype": "int32"}, "floating point"),
        ("random_uniform", [KEY], {"dtype": "float8"}, "unknown dtype"),
        ("random_split", [KEY], {"num": 0}, "'num'"),
        ("random_key", [], {"seed": -1}, "'seed'"),
        ("random_categorical", [KEY, np.zeros((2, 3), np.float32)], {"axis": 2},
         "axis 2 is out of range for an operand of rank 2"),
        ("random_categorical", [KEY, np.zeros((2, 3), np.float32)],
         {"num_samples": 2, "shape": [2]}, "at most one of num_samples and shape"),
        ("random_bernoulli", [KEY, np.zeros(3, np.float32)], {"p": 0.5}, "give one"),
        ("random_bernoulli", [KEY], {"p": 1.5}, "'p'"),
    ],
)
def test_invalid_attrs_and_keys(op, operands, attrs, message):
    with pytest.raises(mp.ValidationError, match="instruction 0") as err:
        run_op(op, *operands, **attrs)
    assert message in str(err.value)
