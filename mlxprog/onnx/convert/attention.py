"""Attention (opset 23+): scaled dot-product attention composed of matmuls
and a softmax, as ONNX's reference computes it.

Q, K, V are ``[B, H, S, D]`` or 3-d ``[B, S, H*D]`` (with ``q_num_heads``
and ``kv_num_heads``); ``past_key``/``past_value`` are concatenated in front
of K/V (the ``present_*`` outputs); ``attn_mask`` (bool: True attends, or
additive, shorter than the key sequence: padded with masked columns),
``is_causal`` and the sliding window ``left_window_size``/
``right_window_size`` (bottom-right aligned: offset by the past length, or per batch
by ``nonpad_kv_seqlen - q_len``), ``nonpad_kv_seqlen`` masks padded keys;
``scale`` (default ``1/sqrt(D)``, applied as ``sqrt(scale)`` to Q and K as
the reference does), ``softcap``, ``softmax_precision``, and
``qk_matmul_output_mode`` 0-3 for the fourth output. GQA: each KV head is
repeated for ``q_heads / kv_heads`` consecutive query heads. A query row with
every key masked gives zeros.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import helper

from ...arrays import name_of
from ..context import Context
from ..registry import converter


def _static(ctx: Context, i: int) -> list[int]:
    dims = list(ctx.shape(i))
    if not all(isinstance(d, int) for d in dims):
        raise ctx.fail(f"input {i} has symbolic dims {dims}; static shapes only")
    return dims


@converter("Attention")
def attention(ctx: Context) -> list:
    """``softmax(softcap(Q K^T * scale) + bias) V`` and the optional
    ``present_key``, ``present_value`` and ``qk_matmul_output`` (see the
    module docstring); static shapes only."""
    b = ctx.b
    left, right = ctx.attr("left_window_size", -1), ctx.attr("right_window_size", -1)
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    qs, ks, vs = _static(ctx, 0), _static(ctx, 1), _static(ctx, 2)
    dtype = name_of(q.dtype)
    rank = len(qs)
    if rank == 3:
        hq, hk = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
        bsz = qs[0]
        q = b.transpose(b.reshape(q, shape=[bsz, qs[1], hq, qs[2] // hq]), axes=[0, 2, 1, 3])
        k = b.transpose(b.reshape(k, shape=[bsz, ks[1], hk, ks[2] // hk]), axes=[0, 2, 1, 3])
        v = b.transpose(b.reshape(v, shape=[bsz, vs[1], hk, vs[2] // hk]), axes=[0, 2, 1, 3])
        dq, dk, dv = qs[2] // hq, ks[2] // hk, vs[2] // hk
    elif rank == 4:
        bsz, hq, hk, dq, dk, dv = qs[0], qs[1], ks[1], qs[3], ks[3], vs[3]
    else:
        raise ctx.fail(f"Q must be 3-d or 4-d (rank {rank})")
    q_len = qs[1] if rank == 3 else qs[2]

    scale = ctx.attr("scale", None)
    if scale is None:
        scale = 1 / np.sqrt(dq)
    s = ctx.scalar(float(np.dtype(ctx.dtype(0)).type(np.sqrt(scale))), q)

    past = 0
    if ctx.has_input(4):
        past = _static(ctx, 4)[2]
        k = b.concatenate(ctx.input(4), k, axis=2)
    if ctx.has_input(5):
        v = b.concatenate(ctx.input(5), v, axis=2)
    present_k, present_v = k, v
    kv_len = (ks[1] if rank == 3 else ks[2]) + past

    zero = ctx.scalar(0, q)
    ninf = ctx.scalar(-math.inf, q)

    # The additive bias [.., q_len, kv_len] (None: nothing masked).
    bias = None
    if ctx.has_input(3):
        mask = ctx.input(3)
        mshape = _static(ctx, 3)
        is_bool = np.dtype(ctx.dtype(3)) == np.bool_
        pad = kv_len - mshape[-1]
        if pad > 0:
            fill = b.full(shape=[*mshape[:-1], pad], dtype="bool" if is_bool else dtype,
                          value=False if is_bool else "-inf")
            mask = b.concatenate(mask, fill, axis=-1)
        bias = b.select(mask, zero, ninf) if is_bool else mask
    causal = bool(ctx.attr("is_causal", 0))
    nonpad = ctx.input(6) if ctx.has_input(6) else None

    def frontier():
        """``(i + offset, j)``: each query's absolute position, each key's."""
        i = b.iota(shape=[q_len, 1], dtype="int32", axis=0)
        j = b.iota(shape=[1, kv_len], dtype="int32", axis=1)
        if nonpad is not None and not ctx.has_input(4):
            off = b.subtract(b.astype(nonpad, dtype="int32"), b.constant(q_len, "int32"))
            return b.add(i, b.reshape(off, shape=[-1, 1, 1, 1])), j
        return b.add(i, b.constant(past, "int32")), j

    if causal:
        pos, j = frontier()
        cb = b.select(b.less_equal(j, pos), zero, ninf)
        bias = cb if bias is None else b.add(bias, cb)
    if left >= 0 or right >= 0:
        pos, j = frontier()
        diff = b.subtract(pos, j)
        allowed = None
        if left >= 0:
            allowed = b.less_equal(diff, b.constant(left, "int32"))
        if right >= 0:
            r_ok = b.less_equal(b.negate(diff), b.constant(right, "int32"))
            allowed = r_ok if allowed is None else b.logical_and(allowed, r_ok)
        wb = b.select(allowed, zero, ninf)
        bias = wb if bias is None else b.add(bias, wb)
    if nonpad is not None:
        j = b.iota(shape=[1, kv_len], dtype="int32", axis=1)
        n = b.reshape(b.astype(nonpad, dtype="int32"), shape=[-1, 1])
        pm = b.reshape(b.select(b.less(j, n), zero, ninf), shape=[-1, 1, 1, kv_len])
        bias = pm if bias is None else b.add(bias, pm)

    if hq != hk:
        if hq % hk:
            raise ctx.fail(f"{hq} query heads are not a multiple of {hk} kv heads")
        r = hq // hk

        def rep(x, d):
            x = b.broadcast_to(b.expand_dims(x, axes=[2]), shape=[bsz, hk, r, kv_len, d])
            return b.reshape(x, shape=[bsz, hq, kv_len, d])

        k, v = rep(k, dk), rep(v, dv)

    qk = b.matmul(b.multiply(q, s), b.transpose(b.multiply(k, s), axes=[0, 1, 3, 2]))
    softcap = ctx.attr("softcap", 0.0)
    if softcap and softcap > 0:
        c = ctx.scalar(softcap, qk)
        qk = b.multiply(b.tanh(b.divide(qk, c)), c)
    mode = ctx.attr("qk_matmul_output_mode", 0)
    logits = qk if bias is None else b.add(qk, bias)
    qk_out = logits if mode == 2 else qk
    precision = ctx.attr("softmax_precision", None)
    x = logits
    if precision is not None:
        x = b.astype(x, dtype=np.dtype(helper.tensor_dtype_to_np_dtype(precision)).name)
    p = b.softmax(x, axes=[-1], precise=True)
    if bias is not None:
        masked = b.all(b.equal(bias, ninf), axes=[-1], keepdims=True)
        p = b.select(masked, b.constant(0, name_of(p.dtype)), p)
    if precision is not None:
        p = b.astype(p, dtype=dtype)
    if mode == 3:
        qk_out = p
    y = b.matmul(p, v)
    if rank == 3:
        y = b.reshape(b.transpose(y, axes=[0, 2, 1, 3]), shape=[bsz, q_len, -1])
    outs = [y, present_k, present_v, qk_out]
    return [o if ctx.wants_output(n) else None for n, o in enumerate(outs[:ctx.num_outputs])]
