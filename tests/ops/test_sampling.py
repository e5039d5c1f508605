"""Token sampling (mlxprog/ops/sampling.py), run through compiled programs."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from helpers import assert_close, run_op
from kernel_helpers import as_np, check_invalid, randn

# Every op here runs with native CPU kernels and with MLX's ops (conftest.py).
pytestmark = pytest.mark.usefixtures("native_and_mlx_ops")

KEY = mx.random.key(7)
PROBS = np.array([0.5, 0.3, 0.15, 0.05])


def draws(n, probs=PROBS, key=KEY, **attrs):
    """n tokens drawn from one distribution in a single compiled call."""
    logits = mx.broadcast_to(mx.array(np.log(probs).astype(np.float32)), (n, len(probs)))
    ids, next_key = run_op("sample", logits, key, **attrs)
    assert ids.dtype == mx.int32 and ids.shape == (n,)
    return np.array(ids), next_key


def test_sample_greedy():
    logits = randn(5, 50)
    assert_close(run_op("sample_greedy", logits), np.argmax(as_np(logits), -1), dtype=mx.int32)
    ids, _ = run_op("sample", logits, KEY, temperature=0.0)
    assert_close(ids, np.argmax(as_np(logits), -1), dtype=mx.int32)


def test_sample_fixed_key_repeats_and_returns_the_next_key():
    logits = randn(64, 100)
    ids, next_key = run_op("sample", logits, KEY, top_p=0.75)
    again, _ = run_op("sample", logits, KEY, top_p=0.75)
    eager, _ = run_op("sample", logits, KEY, top_p=0.75, eager=True)
    other, _ = run_op("sample", logits, next_key, top_p=0.75)
    assert_close(again, np.array(ids))
    assert_close(eager, np.array(ids))
    assert not np.array_equal(np.array(other), np.array(ids))
    assert_close(next_key, np.array(mx.random.split(KEY)[1]))


def test_sample_top_k_stays_in_the_top_k():
    logits = randn(2000, 30)
    ids, _ = run_op("sample", logits, KEY, top_k=3)
    top3 = np.argsort(-as_np(logits), axis=-1)[:, :3]
    assert np.all((top3 == np.array(ids)[:, None]).any(-1))


@pytest.mark.parametrize("attrs, allowed", [
    ({"top_p": 0.75}, {0, 1}),
    ({"top_p": 0.85}, {0, 1, 2}),
    ({"min_p": 0.2}, {0, 1, 2}),
    ({"top_k": 3, "top_p": 0.75}, {0, 1}),
])
def test_sample_top_p_and_min_p_exclude_the_tail(attrs, allowed):
    ids, _ = draws(4000, **attrs)
    assert set(ids.tolist()) == allowed


def test_sample_distribution():
    n = 20000
    ids, _ = draws(n)
    freq = np.bincount(ids, minlength=4) / n
    assert np.all(np.abs(freq - PROBS) < 0.02), freq  # ~6 standard deviations
    ids, _ = draws(n, temperature=0.5)  # p ** 2, renormalised
    sharpened = PROBS**2 / (PROBS**2).sum()
    assert np.all(np.abs(np.bincount(ids, minlength=4) / n - sharpened) < 0.02)
    ids, _ = draws(n, top_p=0.75)  # renormalised over the nucleus {0, 1}
    assert abs(np.mean(ids == 0) - 0.5 / 0.8) < 0.02


@pytest.mark.parametrize("attrs, match", [
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"min_p": 1.0}, "min_p"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": 11}, "top_k 11 exceeds the vocabulary size 10"),
])
def test_sample_invalid_params(attrs, match):
    check_invalid(match, "sample", randn(2, 10), KEY, **attrs)


def test_sample_invalid_operands():
    check_invalid(r"key must be a PRNG key uint32\[2\]", "sample", randn(2, 10), mx.zeros((2,)))
    check_invalid("logits must be a float array", "sample", mx.zeros((2, 10), mx.int32), KEY)


def test_repetition_penalty():
    logits = randn(2, 12)
    history = np.array([[3, 3, 0, -1, -1], [11, 5, 7, 2, 12]])  # -1 and 12: unused slots
    got = run_op("repetition_penalty", logits, mx.array(history, mx.int32), penalty=1.5)
    expected = as_np(logits)
    for row, ids in enumerate(history):
        for i in set(ids.tolist()) & set(range(12)):
            value = expected[row, i]
            expected[row, i] = value / 1.5 if value > 0 else value * 1.5
    assert_close(got, expected, dtype=mx.float32)
    check_invalid("history must be integer token ids", "repetition_penalty", logits,
                  mx.zeros((3, 5), mx.int32), penalty=1.5)
    check_invalid("penalty", "repetition_penalty", logits, mx.zeros((2, 5), mx.int32), penalty=0)


def test_sampling_in_a_decode_step():
    """A key carried across compiled calls gives a reproducible token stream."""
    b = mp.ProgramBuilder("pick")
    logits = b.input("logits", (1, 20))
    key = b.input("key", (2,), "uint32")
    history = b.input("history", (1, 4), "int32")
    ids, next_key = b.sample(b.repetition_penalty(logits, history, penalty=2.0), key, top_k=5)
    exe = mp.compile(b.build([ids, next_key]))

    def stream():
        key, history, tokens = KEY, mx.full((1, 4), -1, mx.int32), []
        for step in range(4):
            ids, key = exe(mx.ones((1, 20)) * math.cos(step), key, history)
            history[0, step] = ids[0]
            tokens.append(ids.item())
        return tokens

    assert stream() == stream()
    assert exe.stats.traces == 1
