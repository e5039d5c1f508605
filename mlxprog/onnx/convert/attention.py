"""Attention (opset 23+): scaled dot-product attention composed of matmuls
and a softmax, as ONNX's reference computes it; also RotaryEmbedding,
LinearAttention (a recurrence: a ``while`` loop over the steps) and the
preview domain's FlexAttention (its modifier subgraphs converted in place).

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
from onnx import TensorProto, helper

from ...arrays import name_of
from ..context import Context
from ..dtypes import dtype_name
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


@converter("RotaryEmbedding")
def rotary_embedding(ctx: Context) -> list:
    """Rotary position embedding of ``X`` (``[batch, heads, seq, head_size]``,
    or ``[batch, seq, hidden]`` with ``num_heads``) by ``cos_cache`` and
    ``sin_cache`` (``[max_pos, dim/2]`` indexed by ``position_ids``, else
    ``[batch, seq, dim/2]``): the first ``rotary_embedding_dim`` features
    (0: all) are rotated in halves, or in even/odd pairs (``interleaved=1``)."""
    b = ctx.b
    shape = list(ctx.shape(0))
    interleaved = ctx.choice("interleaved", (0, 1), 0)
    if len(shape) == 4:
        batch, heads, seq, head = shape
        x = b.transpose(ctx.input(0), axes=[0, 2, 1, 3])
    elif len(shape) == 3:
        heads = ctx.attr("num_heads", 0)
        if not isinstance(shape[2], int) or heads < 1 or shape[2] % heads:
            raise ctx.fail(f"attribute num_heads={heads} must divide the hidden size "
                           f"{shape[2]} of a 3-D input")
        batch, seq, head = shape[0], shape[1], shape[2] // heads
        x = b.reshape(ctx.input(0), shape=[batch, seq, heads, head])
    else:
        raise ctx.fail(f"X must be 3-D or 4-D; its shape is {shape}")
    dim = ctx.attr("rotary_embedding_dim", 0) or head
    if not isinstance(head, int) or dim % 2 or not 0 < dim <= head:
        raise ctx.fail(f"attribute rotary_embedding_dim={dim} must be even and at most the "
                       f"head size {head}")
    cos, sin = ctx.input(1), ctx.input(2)
    if ctx.has_input(3):
        positions = ctx.input(3)
        cos, sin = b.take(cos, positions, axis=0), b.take(sin, positions, axis=0)
    if ctx.shape(1)[-1] != dim // 2:
        raise ctx.fail(f"the caches' last axis must be rotary_embedding_dim/2 = {dim // 2}; "
                       f"cos_cache's shape is {list(ctx.shape(1))}")
    # [batch, seq, 1, dim/2] against [batch, seq, heads, dim/2].
    cos, sin = (b.astype(b.expand_dims(c, axes=[2]), dtype=name_of(x.dtype))
                if c.dtype != x.dtype else b.expand_dims(c, axes=[2]) for c in (cos, sin))
    half = dim // 2
    lead = [batch, seq, heads]
    if interleaved:
        pairs = b.reshape(b.slice(x, lengths=[*lead, dim], starts=[0, 0, 0, 0]),
                          shape=[*lead, half, 2])
        x1, x2 = (b.reshape(b.slice(pairs, lengths=[*lead, half, 1], starts=[0, 0, 0, 0, i]),
                            shape=[*lead, half]) for i in (0, 1))
    else:
        x1, x2 = (b.slice(x, lengths=[*lead, half], starts=[0, 0, 0, i * half]) for i in (0, 1))
    real = b.subtract(b.multiply(cos, x1), b.multiply(sin, x2))
    imag = b.add(b.multiply(sin, x1), b.multiply(cos, x2))
    if interleaved:
        rotated = b.reshape(b.stack(real, imag, axis=4), shape=[*lead, dim])
    else:
        rotated = b.concatenate(real, imag, axis=3)
    if dim < head:
        rest = b.slice(x, lengths=[*lead, head - dim], starts=[0, 0, 0, dim])
        rotated = b.concatenate(rotated, rest, axis=3)
    if len(shape) == 3:
        return [b.reshape(rotated, shape=shape)]
    return [b.transpose(rotated, axes=[0, 2, 1, 3])]


_UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


def _heads(ctx: Context, i: int, heads: int, what: str):
    """Input ``i`` (``[B, T, heads * d]``) as float32 ``[B, heads, T, d]``, and d."""
    shape = list(ctx.shape(i))
    if len(shape) != 3 or not all(isinstance(s, int) for s in shape) or shape[2] % heads:
        raise ctx.fail(f"{what} must be [B, T, heads * d] with static sizes and {heads} heads; "
                       f"its shape is {shape}")
    b = ctx.b
    x = b.reshape(b.astype(ctx.input(i), dtype="float32"),
                  shape=[shape[0], shape[1], heads, shape[2] // heads])
    return b.transpose(x, axes=[0, 2, 1, 3]), shape[2] // heads


@converter("LinearAttention")
def linear_attention(ctx: Context) -> list:
    """Linear attention as a recurrence over the T steps (a ``while`` loop,
    in float32): the state ``[B, H_kv, d_k, d_v]`` (``past_state``, default
    zeros) is decayed by ``exp(decay_t)`` (``gated`` rules), gets the outer
    product of ``k_t`` with ``v_t`` (the ``delta`` rules first replace
    ``v_t`` by ``beta_t * (v_t - state^T k_t)``), and is read by each query
    head of its group: ``o_t = scale * q_t state``. ``update_rule`` (default
    ``gated_delta``) decides which of ``decay`` (input 4) and ``beta``
    (input 5) are given; ``chunk_size`` is a tuning hint (ignored)."""
    rule = ctx.choice("update_rule", _UPDATE_RULES, "gated_delta")
    hq, hkv = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    if hq < 1 or hkv < 1 or hq % hkv:
        raise ctx.fail(f"attribute q_num_heads={hq} must be a positive multiple of "
                       f"kv_num_heads={hkv}")
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    for i, name, needed in ((4, "decay", gated), (5, "beta", delta)):
        if ctx.has_input(i) != needed:
            raise ctx.fail(f"update_rule={rule!r} {'needs' if needed else 'takes no'} "
                           f"input {i} ({name})")
    b = ctx.b
    q, dk = _heads(ctx, 0, hq, "query")
    k, dk_ = _heads(ctx, 1, hkv, "key")
    v, dv = _heads(ctx, 2, hkv, "value")
    batch, steps = ctx.shape(0)[:2]
    if dk_ != dk or list(ctx.shape(1))[:2] != [batch, steps] \
            or list(ctx.shape(2))[:2] != [batch, steps]:
        raise ctx.fail("query, key and value must share B and T, and query and key the "
                       "head size d_k")
    group = hq // hkv
    # Query head h reads kv head h // group: [B, H_kv, group, T, d_k].
    q = b.reshape(q, shape=[batch, hkv, group, steps, dk])
    scale = ctx.attr("scale", 0.0) or 1 / math.sqrt(dk)
    carried = [q, k, v]
    if gated:
        width = ctx.shape(4)[-1]
        if width not in (hkv, hkv * dk):
            raise ctx.fail(f"decay's last axis must be kv_num_heads ({hkv}) or "
                           f"kv_num_heads * d_k ({hkv * dk}); it is {width}")
        decay, _ = _heads(ctx, 4, hkv, "decay")  # [B, H_kv, T, 1 or d_k]
        carried.append(b.exp(decay))
    if delta:
        width = ctx.shape(5)[-1]
        if width not in (hkv, 1):
            raise ctx.fail(f"beta's last axis must be kv_num_heads ({hkv}) or 1; it is {width}")
        beta, _ = _heads(ctx, 5, width, "beta")  # [B, H_kv or 1, T, 1]
        carried.append(beta)
    state_shape = [batch, hkv, dk, dv]
    if ctx.has_input(3):
        if list(ctx.shape(3)) != state_shape:
            raise ctx.fail(f"past_state must be {state_shape}; its shape is "
                           f"{list(ctx.shape(3))}")
        state = b.astype(ctx.input(3), dtype="float32")
    else:
        state = b.full(shape=state_shape, dtype="float32", value=0.0)
    out = b.full(shape=[batch, hkv, group, steps, dv], dtype="float32", value=0.0)

    def at(sb, x, i):
        """Step ``i`` of ``x`` (T on axis -2), that axis dropped."""
        lengths = list(x.shape)
        lengths[-2] = 1
        return sb.squeeze(sb.slice(x, i, lengths=lengths, dynamic_axes=[len(lengths) - 2]),
                          axes=[len(lengths) - 2])

    def cond_fn(sb, i, *rest):
        return sb.less(i, sb.constant(steps, "int32"))

    def body_fn(sb, i, state, out, q, k, v, *gates):
        k_t, v_t = at(sb, k, i), at(sb, v, i)  # [B, H_kv, d]
        rest = list(gates)
        if gated:
            state = sb.multiply(state, sb.expand_dims(at(sb, rest.pop(0), i), axes=[3]))
        if delta:
            retrieved = sb.squeeze(sb.matmul(sb.expand_dims(k_t, axes=[2]), state), axes=[2])
            v_t = sb.multiply(at(sb, rest.pop(0), i), sb.subtract(v_t, retrieved))
        state = sb.add(state, sb.multiply(sb.expand_dims(k_t, axes=[3]),
                                          sb.expand_dims(v_t, axes=[2])))
        o_t = sb.multiply(sb.matmul(at(sb, q, i), state), sb.constant(scale, "float32"))
        out = sb.put_slice(out, sb.expand_dims(o_t, axes=[3]), i, dynamic_axes=[3])
        return [sb.add(i, sb.constant(1, "int32")), state, out, q, k, v, *gates]

    init = [b.constant(0, "int32"), state, out, *carried]
    _, state, out, *_ = b.while_loop(cond_fn, body_fn, init, max_iterations=max(steps, 1))
    out = b.reshape(out, shape=[batch, hq, steps, dv])
    out = b.reshape(b.transpose(out, axes=[0, 2, 1, 3]), shape=[batch, steps, hq * dv])
    out_dtype = dtype_name(ctx.dtype(0))
    state_dtype = dtype_name(ctx.dtype(3) if ctx.has_input(3) else ctx.dtype(0))
    return [b.astype(out, dtype=out_dtype), b.astype(state, dtype=state_dtype)]


_SOFTMAX_TYPES = {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16",
                  TensorProto.BFLOAT16: "bfloat16", TensorProto.DOUBLE: "float64"}


@converter("FlexAttention", domain="ai.onnx.preview")
def flex_attention(ctx: Context) -> list:
    """``softmax(score_mod((Q @ K^T) * scale)) -> prob_mod -> @ V`` over
    ``[B, H, S, D]`` inputs (GQA: each K/V head serves a contiguous group of
    query heads): the modifier subgraphs (one rank-4 input, one output) are
    converted in place; scores and probabilities are in
    ``softmax_precision`` (default float32, float64 for float64 inputs)."""
    b = ctx.b
    q_shape, k_shape, v_shape = (list(ctx.shape(i)) for i in range(3))
    if not all(len(s) == 4 for s in (q_shape, k_shape, v_shape)):
        raise ctx.fail(f"Q, K and V must be rank 4; their shapes are {q_shape}, {k_shape}, "
                       f"{v_shape}")
    hq, hkv = q_shape[1], k_shape[1]
    if v_shape[1] != hkv or v_shape[2] != k_shape[2] or k_shape[3] != q_shape[3] \
            or not isinstance(hq, int) or not isinstance(hkv, int) or hq % hkv:
        raise ctx.fail(f"K and V must share heads and length, Q and K the head size, and "
                       f"Q's heads be a multiple of K's: {q_shape}, {k_shape}, {v_shape}")
    precision = ctx.attr("softmax_precision", None)
    if precision is not None and precision not in _SOFTMAX_TYPES:
        raise ctx.fail(f"attribute softmax_precision={precision} is not a float type "
                       f"(supported: {sorted(_SOFTMAX_TYPES)})")
    in_dtype = ctx.dtype(0)
    compute = (_SOFTMAX_TYPES[precision] if precision is not None
               else "float64" if in_dtype == np.float64 else "float32")
    scale = ctx.attr("scale", None)
    scale = 1 / math.sqrt(q_shape[3]) if scale is None else scale
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    if hq != hkv:
        def repeat(x, shape):
            x = b.broadcast_to(b.expand_dims(x, axes=[2]),
                               shape=[shape[0], hkv, hq // hkv, *shape[2:]])
            return b.reshape(x, shape=[shape[0], hq, *shape[2:]])

        k, v = repeat(k, k_shape), repeat(v, v_shape)
    # Q and K each scaled by sqrt(scale) (computed in float32), as the reference.
    root = b.constant(float(np.sqrt(np.float32(scale))), name_of(q.dtype))
    scores = b.matmul(b.multiply(q, root), b.transpose(b.multiply(k, root), axes=[0, 1, 3, 2]))

    def modified(name: str, x):
        """``x`` through the modifier subgraph ``name`` where it is given."""
        if ctx.attr(name, None) is None:
            return x
        (y,) = ctx.subgraph(name)(b, x)  # converted into this builder scope
        return b.astype(y, dtype=compute)

    scores = modified("score_mod", b.astype(scores, dtype=compute))
    probs = modified("prob_mod", b.softmax(scores, axes=[-1], precise=True))
    out = b.matmul(probs, b.astype(v, dtype=compute))
    return [b.astype(out, dtype=dtype_name(ctx.dtype(2)))]
