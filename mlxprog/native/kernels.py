"""The native kernels as the ops call them: each function checks that its
kernel covers the operands and returns the kernel's (lazy) result, or None,
in which case the op runs MLX's own function (which also raises MLX's own
error for operands it rejects). Each ``covers_*`` takes avals (shape and
dtype) only, so the ops' ``native_coverage`` rules ask the same question of
a program for ``mlxprog inspect``. Each kernel function takes the
executable's :class:`~mlxprog.native.Setting` first (the op's
``context.native``): whether kernels may run, and the counters they add to.
"""

from __future__ import annotations

import mlx.core as mx

from ..arrays import AVal
from . import Setting, active, inactive_reason, record

FLOATS = (mx.float32, mx.float16, mx.bfloat16)
QMM_BITS = (1, 2, 3, 4, 5, 6, 8)
QMM_GROUP_SIZES = (32, 64, 128)
Q8_BITS = (4, 8)  # the codes the int8 kernel reads


def covers_quantized_matmul(x: AVal, w: AVal, scales: AVal, biases: AVal | None,
                            transpose: bool, group_size: int, bits: int, mode: str) -> bool:
    """Whether the native quantized matmul computes this case: affine mode
    with biases, a 2-D packed ``w`` (no batch of weights), float activations
    of rank >= 2 with any batch dims, and operand shapes that agree (else
    MLX's op decides, and raises its error)."""
    if mode != "affine" or biases is None or bits not in QMM_BITS \
            or group_size not in QMM_GROUP_SIZES:
        return False
    (x_shape, x_dtype), (w_shape, w_dtype) = x, w
    (s_shape, s_dtype), (b_shape, b_dtype) = scales, biases
    if x_dtype not in FLOATS or s_dtype not in FLOATS or b_dtype not in FLOATS:
        return False
    if w_dtype != mx.uint32 or len(w_shape) != 2 or len(x_shape) < 2:
        return False
    rows, packed = w_shape
    codes = packed * 32 // bits  # the unpacked length of a row of w
    if transpose:  # w is (N, K)
        k, groups_shape = codes, (rows, codes // group_size)
    else:  # w is (K, N)
        k, groups_shape = rows, (rows, codes // group_size)
    return (x_shape[-1] == k and codes % group_size == 0 and tuple(s_shape) == groups_shape
            and tuple(b_shape) == groups_shape and k > 0 and 0 not in x_shape[:-1])


def int8_uncovered_reason(x: AVal, w: AVal, scales: AVal, biases: AVal | None,
                          transpose: bool, group_size: int, bits: int, mode: str) -> str:
    """Why the int8 kernel cannot compute this case ("" when it can): it
    needs the native quantized matmul's case, with ``transpose`` and 4- or
    8-bit codes."""
    if mode != "affine":
        return f"int8 numerics need mode 'affine', found {mode!r}"
    if not transpose:
        return "int8 numerics need transpose=true (groups along x's last axis)"
    if bits not in Q8_BITS:
        return f"int8 numerics need 4- or 8-bit codes, found {bits}"
    if not covers_quantized_matmul(x, w, scales, biases, transpose, group_size, bits, mode):
        return "the native kernel does not cover these operands (dtypes, shapes)"
    return ""


def quantized_matmul(setting: Setting, x: mx.array, w: mx.array, scales: mx.array,
                     biases: mx.array | None, *, transpose: bool, group_size: int, bits: int,
                     mode: str) -> mx.array | None:
    """The native ``mx.quantized_matmul``, or None where it does not apply."""
    native = active(setting)
    if native is None or not covers_quantized_matmul(
            AVal.of(x), AVal.of(w), AVal.of(scales), None if biases is None else AVal.of(biases),
            transpose, group_size, bits, mode):
        return None
    record(setting, "quantized_matmul")
    return native.quantized_matmul(x, w, scales, biases, transpose=transpose,
                                   group_size=group_size, bits=bits)


def quantized_matmul_int8(setting: Setting, x: mx.array, w: mx.array, scales: mx.array,
                          biases: mx.array | None, *, transpose: bool, group_size: int,
                          bits: int, mode: str) -> tuple[mx.array | None, str]:
    """The quantized matmul in int8 numerics (x quantized to int8 per group,
    integer dot products) and "", or None and why it cannot run here."""
    reason = inactive_reason(setting) or int8_uncovered_reason(
        AVal.of(x), AVal.of(w), AVal.of(scales), None if biases is None else AVal.of(biases),
        transpose, group_size, bits, mode)
    if reason:
        return None, reason
    record(setting, "quantized_matmul")
    return active(setting).quantized_matmul(x, w, scales, biases, transpose=transpose,
                                            group_size=group_size, bits=bits, int8=True), ""


def covers_rms_norm(x: AVal, weight: AVal | None) -> bool:
    """Whether the native RMS norm computes this case: float x of rank >= 1
    with a non-empty last axis, and a weight ``[D]`` of x's dtype."""
    (x_shape, x_dtype) = x
    return (weight is not None and x_dtype in FLOATS and len(x_shape) >= 1
            and x_shape[-1] > 0 and weight[1] == x_dtype and tuple(weight[0]) == (x_shape[-1],))


def rms_norm(setting: Setting, x: mx.array, weight: mx.array | None, eps: float) -> mx.array | None:
    """The native ``mx.fast.rms_norm``, or None where it does not apply."""
    native = active(setting)
    if native is None or not covers_rms_norm(AVal.of(x),
                                             None if weight is None else AVal.of(weight)):
        return None
    record(setting, "fast_rms_norm")
    return native.rms_norm(x, weight, eps=eps)


def covers_swiglu_halves(x: AVal) -> bool:
    """Whether the native SwiGLU over halves computes this case: float32 x
    of rank >= 1 with a non-empty, even last axis."""
    (shape, dtype) = x
    return dtype == mx.float32 and len(shape) >= 1 and shape[-1] > 0 and shape[-1] % 2 == 0


def swiglu_halves(setting: Setting, x: mx.array) -> mx.array | None:
    """The native ``silu(x[..., :I]) * x[..., I:]``, or None where it does not
    apply."""
    native = active(setting)
    if native is None or not covers_swiglu_halves(AVal.of(x)):
        return None
    record(setting, "fast_swiglu")
    return native.swiglu_halves(x)


def covers_add_rms_norm(x: AVal, y: AVal, weight: AVal) -> bool:
    """Whether the native add + RMS norm computes this case: float32 x and y
    of one shape, rank >= 1 with a non-empty last axis, weight float32 ``[D]``."""
    return (x == y and x[1] == mx.float32 and weight[1] == mx.float32
            and covers_rms_norm(x, weight))


def add_rms_norm(setting: Setting, x: mx.array, y: mx.array, weight: mx.array,
                 eps: float) -> list[mx.array] | None:
    """The native ``(x + y, mx.fast.rms_norm(x + y, weight))``, or None where
    it does not apply."""
    native = active(setting)
    if native is None or not covers_add_rms_norm(AVal.of(x), AVal.of(y), AVal.of(weight)):
        return None
    record(setting, "fast_add_rms_norm")
    return native.add_rms_norm(x, y, weight, eps=eps)


def covers_rope(x: AVal, offset_size: int, dims: int, freqs: AVal | None) -> bool:
    """Whether the native RoPE computes this case: float x ``[B, *, T, D]``
    with an even ``dims <= D``, one offset or one per example, and float32
    ``freqs [dims / 2]`` if any."""
    (x_shape, x_dtype) = x
    if x_dtype not in FLOATS or len(x_shape) < 3 or 0 in x_shape:
        return False
    if dims % 2 or dims > x_shape[-1] or offset_size not in (1, x_shape[0]):
        return False
    return freqs is None or (freqs[1] == mx.float32 and tuple(freqs[0]) == (dims // 2,))


def rope(setting: Setting, x: mx.array, offset: mx.array | int, *, dims: int,
         traditional: bool, base: float, scale: float, freqs: mx.array | None = None,
         op: str) -> mx.array | None:
    """The native ``mx.fast.rope`` (offset an int or an integer array of one
    element or one per example), or None where it does not apply. ``op`` is
    the calling op, counted when the kernel runs."""
    native = active(setting)
    offset_size = 1 if isinstance(offset, int) else offset.size
    if native is None or not covers_rope(AVal.of(x), offset_size, dims,
                                         None if freqs is None else AVal.of(freqs)):
        return None
    offsets = (mx.array([offset], dtype=mx.int32) if isinstance(offset, int)
               else _int32_vector(offset))
    record(setting, op)
    return native.rope(x, offsets, dims=dims, traditional=traditional, base=base, scale=scale,
                       freqs=freqs)


def covers_cache_attention(q: AVal, k_cache: AVal, v_cache: AVal) -> bool:
    """Whether the native attention computes this case: float32 queries
    ``[B, H, T, D]`` over float32 key and value caches ``[B, H_kv, S, D]``
    (alike) with H a multiple of H_kv (the ``BHTD`` layout, no sinks)."""
    (q_shape, q_dtype), (c_shape, c_dtype) = q, k_cache
    if k_cache != v_cache or q_dtype != mx.float32 or c_dtype != mx.float32 \
            or len(q_shape) != 4 or len(c_shape) != 4:
        return False
    B, H, T, D = q_shape
    return (c_shape[0] == B and c_shape[3] == D and c_shape[1] > 0 and H % c_shape[1] == 0
            and 0 not in q_shape and c_shape[2] > 0)


def cache_attention(setting: Setting, q: mx.array, k_cache: mx.array, v_cache: mx.array,
                    start: mx.array, key_mask: mx.array | None, scale: float,
                    window: int | None = None,
                    softcap: float | None = None) -> mx.array | None:
    """Attention of queries ``[B, H, T, D]`` over caches ``[B, H_kv, S, D]``:
    query t sees key j when ``j <= start + t``, with a ``window`` also
    ``j > start + t - window``, and ``key_mask[b, j]``; a query that sees no
    key gets zeros. Scores ``s = q . k * scale`` are capped at
    ``softcap * tanh(s / softcap)`` when ``softcap`` is given. None where the
    kernel does not apply."""
    native = active(setting)
    if native is None or not covers_cache_attention(AVal.of(q), AVal.of(k_cache),
                                                    AVal.of(v_cache)):
        return None
    record(setting, "kv_cache_sdpa_update")
    if key_mask is not None and key_mask.dtype != mx.bool_:
        key_mask = key_mask.astype(mx.bool_)
    # The kernel reads 0 as no window (every key up to the query's) and no cap.
    return native.cache_attention(q, k_cache, v_cache, _int32_vector(start), key_mask,
                                  scale=scale, window=window or 0, softcap=softcap or 0.0)


def covers_cache_attention_block(qkv: AVal, k_cache: AVal, v_cache: AVal) -> bool:
    """Whether the native attention block computes this case: float32 qkv
    ``[B, T, F]`` with T >= 1 and float32 caches ``[B, H_kv, S, D]`` (alike,
    S >= 1); the op checks how F splits into heads."""
    (x_shape, x_dtype), (c_shape, c_dtype) = qkv, k_cache
    return (k_cache == v_cache and x_dtype == mx.float32 and c_dtype == mx.float32
            and len(x_shape) == 3 and len(c_shape) == 4 and 0 not in x_shape
            and 0 not in c_shape and x_shape[0] == c_shape[0])


def cache_attention_block(setting: Setting, qkv: mx.array, k_cache: mx.array, v_cache: mx.array,
                          start: mx.array, positions: mx.array, *, heads: int, kv_heads: int,
                          dims: int, traditional: bool, base: float, rope_scale: float,
                          scale: float, freqs: mx.array | None,
                          key_mask: mx.array | None) -> list[mx.array] | None:
    """The native ``kv_cache_attention_block`` (``start``: the clamped int32
    cache slot, ``positions``: int32 RoPE start positions, one or per row):
    (output, k_cache, v_cache), or None where it does not apply."""
    native = active(setting)
    if native is None or not covers_cache_attention_block(AVal.of(qkv), AVal.of(k_cache),
                                                          AVal.of(v_cache)):
        return None
    if freqs is not None and freqs.dtype != mx.float32:
        return None
    record(setting, "kv_cache_attention_block")
    if key_mask is not None and key_mask.dtype != mx.bool_:
        key_mask = key_mask.astype(mx.bool_)
    return native.cache_attention_block(
        qkv, k_cache, v_cache, start, positions, heads=heads, kv_heads=kv_heads, dims=dims,
        traditional=traditional, base=base, rope_scale=rope_scale, scale=scale, freqs=freqs,
        key_mask=key_mask)


def transformer_layer_uncovered_reason(h: AVal, input_norm: AVal, post_norm: AVal,
                                       projections: dict[str, list[AVal]], k_cache: AVal,
                                       v_cache: AVal, *, group_size: int, bits: int,
                                       numerics: str) -> str:
    """Why the native transformer layer cannot compute this case ("" when
    it can): it needs float32 h ``[B, T, hidden]`` and caches, float norm
    weights, and projections the native quantized matmul covers (4- or
    8-bit codes in int8 numerics); the op checks how the shapes fit."""
    if h[1] != mx.float32 or len(h[0]) != 3 or 0 in h[0]:
        return f"the native layer needs a float32 h [B, T, hidden], found {h}"
    if not covers_cache_attention_block(
            AVal((h[0][0], h[0][1], 1), mx.float32), k_cache, v_cache):
        return f"the native layer needs float32 caches [B, kv_heads, S, D], found {k_cache}"
    if input_norm[1] not in FLOATS or post_norm[1] not in FLOATS:
        return "the native layer needs float16, bfloat16 or float32 norm weights"
    if numerics == "int8" and bits not in Q8_BITS:
        return f"int8 numerics need 4- or 8-bit codes, found {bits}"
    for name, (w, scales, biases) in projections.items():
        features = (w[0][1] * 32 // bits) if len(w[0]) == 2 else 0
        x = AVal((1, features), mx.float32)
        if not covers_quantized_matmul(x, w, scales, biases, True, group_size, bits, "affine"):
            return f"the native quantized matmul does not cover projection {name}"
    return ""


def transformer_layer(setting: Setting, h: mx.array, input_norm: mx.array, post_norm: mx.array,
                      projections: dict[str, list[mx.array]], k_cache: mx.array,
                      v_cache: mx.array, *, start: mx.array, positions: mx.array, heads: int,
                      kv_heads: int, dims: int, traditional: bool, base: float,
                      rope_scale: float, scale: float, eps: float, group_size: int, bits: int,
                      numerics: str, freqs: mx.array | None,
                      key_mask: mx.array | None) -> list[mx.array] | None:
    """The native ``transformer_layer`` (``start``: the clamped int32 cache
    slot, ``positions``: int32 RoPE start positions; ``projections``: the
    (w, scales, biases) of qkv, o, gate_up and down): (h, k_cache, v_cache),
    or None where it does not apply."""
    native = active(setting)
    if native is None or (freqs is not None and freqs.dtype != mx.float32):
        return None
    avals = {name: [AVal.of(a) for a in parts] for name, parts in projections.items()}
    if transformer_layer_uncovered_reason(
            AVal.of(h), AVal.of(input_norm), AVal.of(post_norm), avals, AVal.of(k_cache),
            AVal.of(v_cache), group_size=group_size, bits=bits, numerics=numerics):
        return None
    record(setting, "transformer_layer")
    if key_mask is not None and key_mask.dtype != mx.bool_:
        key_mask = key_mask.astype(mx.bool_)
    return native.transformer_layer(
        h, input_norm, projections["qkv"], projections["o"], post_norm, projections["gate_up"],
        projections["down"], k_cache, v_cache, start, positions, heads=heads,
        kv_heads=kv_heads, dims=dims, traditional=traditional, base=base,
        rope_scale=rope_scale, scale=scale, eps=eps, group_size=group_size, bits=bits,
        int8=numerics == "int8", freqs=freqs, key_mask=key_mask)


def _int32_vector(a: mx.array) -> mx.array:
    """``a`` as a 1-D int32 array, adding graph nodes only where it is not one
    already (each node costs a few microseconds per evaluation on the CPU)."""
    if a.ndim != 1:
        a = a.reshape(-1)
    return a if a.dtype == mx.int32 else a.astype(mx.int32)

