"""Token sampling: greedy, with temperature and top-k / top-p / min-p
filters under a PRNG key operand (so a decode-step program is traced once),
and a repetition penalty."""

from __future__ import annotations

import math
from typing import Annotated

import mlx.core as mx
from pydantic import Field

from ..arrays import AVal, is_floating, is_integer
from .attrs import Attrs, PositiveSize
from .registry import register_op


def _check_logits(logits: AVal) -> None:
    """Logits are a float array ``[..., V]``."""
    if not is_floating(logits.dtype) or len(logits.shape) < 1:
        raise ValueError(f"logits must be a float array [..., V], found {logits}")


@register_op("sample_greedy")
def sample_greedy(operands, attrs):
    """The most likely token: argmax over the last axis of logits ``[..., V]``,
    as int32 ids ``[...]``."""
    return mx.argmax(operands[0], axis=-1).astype(mx.int32)


class SampleAttrs(Attrs):
    """The attributes of ``sample``: temperature and the token filters."""

    temperature: Annotated[float, Field(ge=0)] = 1.0
    top_k: PositiveSize | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    min_p: Annotated[float, Field(ge=0, lt=1)] = 0.0


def _check_sample(avals: list[AVal], attrs: SampleAttrs) -> None:
    """Float logits with at least ``top_k`` tokens, and a PRNG key."""
    logits, key = avals
    _check_logits(logits)
    if attrs.top_k is not None and attrs.top_k > logits.shape[-1]:
        raise ValueError(f"top_k {attrs.top_k} exceeds the vocabulary size {logits.shape[-1]}")
    if key.shape != (2,) or key.dtype != mx.uint32:
        raise ValueError(f"key must be a PRNG key uint32[2] (mx.random.key), found {key}")


def _scatter_flags(like: mx.array, indices: mx.array, flags: mx.array) -> mx.array:
    """A bool array shaped like ``like`` with ``flags`` at ``indices`` on the last
    axis and false elsewhere."""
    return mx.put_along_axis(mx.zeros(like.shape, mx.bool_), indices, flags, axis=-1)


@register_op("sample", attrs=SampleAttrs, operands=2, outputs=2, check=_check_sample)
def sample(operands, attrs):
    """Draw one token per row of logits ``[..., V]`` with a PRNG key operand
    (``uint32[2]``, as ``mx.random.key``). Results: int32 ids ``[...]`` and the
    next key, to feed to the following step; a given key always draws the same
    tokens.

    The logits are divided by ``temperature`` (0 means greedy: the argmax), then
    restricted to the tokens that pass every filter set, each judged on the
    tempered distribution: the ``top_k`` most likely; the smallest most-likely
    set whose probability reaches ``top_p``; those with probability at least
    ``min_p`` times the most likely one's. The most likely token always passes."""
    logits, key = operands
    draw_key, next_key = mx.random.split(key)
    if attrs.temperature == 0:
        return mx.argmax(logits, axis=-1).astype(mx.int32), next_key
    ids = mx.random.categorical(filter_logits(logits, attrs), axis=-1, key=draw_key)
    return ids.astype(mx.int32), next_key


def filter_logits(logits: mx.array, attrs: SampleAttrs) -> mx.array:
    """The tempered, filtered logits ``sample`` draws from (``temperature``
    above 0): float32 logits ``[..., V]`` divided by the temperature, -inf
    on the tokens a filter drops. Speculative decoding's accept/reject rule
    (:mod:`mlxprog.llm.speculative`) takes its target distribution from
    here, so that it keeps the one ``sample`` draws from."""
    logits = logits.astype(mx.float32) * (1 / attrs.temperature)
    keep = None
    if attrs.top_k is not None and attrs.top_k < logits.shape[-1]:
        top = mx.argpartition(-logits, kth=attrs.top_k - 1, axis=-1)[..., : attrs.top_k]
        keep = _scatter_flags(logits, top, mx.array(True))
    if attrs.top_p < 1:
        order = mx.argsort(-logits, axis=-1)
        probs = mx.softmax(mx.take_along_axis(logits, order, axis=-1), axis=-1)
        before = mx.cumsum(probs, axis=-1) - probs
        nucleus = _scatter_flags(logits, order, before < attrs.top_p)
        keep = nucleus if keep is None else keep & nucleus
    if attrs.min_p > 0:
        likely = logits - logits.max(axis=-1, keepdims=True) >= math.log(attrs.min_p)
        keep = likely if keep is None else keep & likely
    return logits if keep is None else mx.where(keep, logits, -mx.inf)


class RepetitionPenaltyAttrs(Attrs):
    """The attributes of ``repetition_penalty``."""

    penalty: Annotated[float, Field(gt=0)]


def _check_repetition_penalty(avals: list[AVal], attrs: RepetitionPenaltyAttrs) -> None:
    """Float logits and integer history ids with the logits' leading axes."""
    logits, history = avals
    _check_logits(logits)
    if not is_integer(history.dtype) or history.shape[:-1] != logits.shape[:-1]:
        raise ValueError(
            f"history must be integer token ids [{', '.join(map(str, logits.shape[:-1]))}"
            f"{', ' if len(logits.shape) > 1 else ''}N] matching logits {logits}, "
            f"found {history}"
        )


@register_op("repetition_penalty", attrs=RepetitionPenaltyAttrs, operands=2,
             check=_check_repetition_penalty)
def repetition_penalty(operands, attrs):
    """Make tokens already seen less likely: for each token id in history,
    a positive logit is divided by ``penalty`` and a negative one multiplied by
    it. Operands: logits ``[..., V]`` and history ``[..., N]`` (integer ids; ids
    outside ``[0, V)``, e.g. -1 for unused slots of a fixed-size history, are
    ignored)."""
    logits, history = operands
    vocab = logits.shape[-1]
    valid = (history >= 0) & (history < vocab)
    # Invalid ids go to an extra column that is dropped afterwards.
    slots = mx.where(valid, history, vocab).astype(mx.int32)
    seen = mx.zeros((*logits.shape[:-1], vocab + 1), mx.bool_)
    seen = mx.put_along_axis(seen, slots, mx.array(True), axis=-1)[..., :vocab]
    penalized = mx.where(logits > 0, logits / attrs.penalty, logits * attrs.penalty)
    return mx.where(seen, penalized, logits)
