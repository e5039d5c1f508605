"""The losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both take scores ``[N, C, d1, ...]`` and integer targets ``[N, d1, ...]``
(int32 or int64), an optional per-class ``weight`` ``[C]``, ``ignore_index``
(targets equal to it add nothing and weigh nothing) and ``reduction``:
``none`` (the per-element loss, the target's shape), ``sum``, or ``mean``
(the sum over the sum of the gathered weights of the targets not ignored,
one each without ``weight``). SoftmaxCrossEntropyLoss is the NLL of
``log_softmax(scores, axis=1)`` and can return that log-probability as its
second output. Composed from take_along_axis, take, select and sum.
"""

from __future__ import annotations

from ...arrays import name_of
from ..context import Context
from ..registry import converter


def _nll(ctx: Context, x, target, weight_index: int):
    """The reduced negative log-likelihood of log-probabilities ``x``
    (rank >= 2) at ``target`` (ONNX's NegativeLogLikelihoodLoss)."""
    b = ctx.b
    reduction = ctx.choice("reduction", ("none", "sum", "mean"), "mean")
    if x.ndim < 2:
        raise ctx.fail(f"the input must be [N, C, ...], not rank {x.ndim}")
    dt = name_of(x.dtype)
    t = b.astype(target, dtype="int32")
    ignore = ctx.attr("ignore_index", None)
    keep = None
    if ignore is not None:
        keep = b.not_equal(t, b.constant(int(ignore), "int32"))
        t = b.select(keep, t, b.constant(0, "int32"))
    picked = b.squeeze(b.take_along_axis(x, b.expand_dims(t, axes=[1]), axis=1), axes=[1])
    loss = b.negate(picked)
    w = None
    if ctx.has_input(weight_index):
        w = b.take(ctx.input(weight_index), t, axis=0)
        if name_of(w.dtype) != dt:
            w = b.astype(w, dtype=dt)
    if keep is not None:
        kw = b.astype(keep, dtype=dt)
        w = kw if w is None else w * kw
    if w is not None:
        loss = loss * w
    if reduction == "none":
        return loss
    total = b.sum(loss)
    if reduction == "sum":
        return total
    if w is None:
        return b.mean(loss)
    return total / b.sum(w)


@converter("NegativeLogLikelihoodLoss")
def negative_log_likelihood_loss(ctx: Context) -> list:
    """``-input[n, target[n, d...], d...]`` (weighted, ignored targets left
    out), reduced by ``reduction``."""
    return [_nll(ctx, ctx.input(0), ctx.input(1), 2)]


@converter("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_loss(ctx: Context) -> list:
    """The NLL of ``log_softmax(scores, axis=1)``; the optional second
    output is that log-probability."""
    b = ctx.b
    x = ctx.input(0)
    if x.ndim < 2:
        raise ctx.fail(f"the scores must be [N, C, ...], not rank {x.ndim}")
    log_prob = x - b.logsumexp(x, axes=[1], keepdims=True)
    loss = _nll(ctx, log_prob, ctx.input(1), 2)
    return [loss, log_prob if ctx.wants_output(1) else None][:ctx.num_outputs]
