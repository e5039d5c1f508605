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

from typing import Any, Sequence

import mlx.core as mx

from ..arrays import AVal, is_floating
from ..cache_kinds import CacheKind, Geometry, RecentRing
from ..ggml import types as ggml_types
from . import Setting, active, inactive_reason, record

FLOATS = (mx.float32, mx.float16, mx.bfloat16)
INTEGERS = (mx.int8, mx.int16, mx.int32, mx.int64, mx.uint8, mx.uint16, mx.uint32, mx.uint64)
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


def _slot_rows_fit(x: AVal, indices: AVal, features: int, per_slot: bool) -> bool:
    """A gathered matmul's x and indices as the native kernels read them:
    float ``x`` of ``features`` features, ``[..., K]`` with the indices'
    leading dims (``per_slot``: ``[..., k, K]``, the indices' shape), integer
    ``indices [..., k]``."""
    (x_shape, x_dtype), (i_shape, i_dtype) = x, indices
    lead = tuple(i_shape) if per_slot else tuple(i_shape[:-1])
    return (x_dtype in FLOATS and i_dtype in INTEGERS and len(i_shape) >= 1
            and tuple(x_shape) == (*lead, features))


def gather_uncovered_reason(x: AVal, w: AVal, scales: AVal, biases: AVal | None,
                            indices: AVal, group_size: int, bits: int, mode: str,
                            per_slot: bool, int8: bool) -> str:
    """Why the native expert kernel of MLX-quantized experts cannot compute
    this ``gather_quantized_matmul`` ("" when it can): affine experts ``w``
    uint32 ``[E, N, K * bits / 32]`` (the native quantized matmul's bits;
    4 or 8 for int8 numerics) with float scales and biases ``[E, N, K /
    group_size]``, no empty axis, and x and indices as
    :func:`_slot_rows_fit` reads them."""
    if mode != "affine":
        return f"{'int8 numerics need' if int8 else 'the native kernel needs'} mode 'affine', " \
               f"found {mode!r}"
    if int8 and bits not in Q8_BITS:
        return f"int8 numerics need 4- or 8-bit codes, found {bits}"
    (w_shape, w_dtype), (s_shape, s_dtype) = w, scales
    fits = (biases is not None and w_dtype == mx.uint32 and len(w_shape) == 3
            and 0 not in w_shape and bits in QMM_BITS and group_size in QMM_GROUP_SIZES
            and s_dtype in FLOATS and biases[1] in FLOATS and 0 not in x[0]
            and 0 not in indices[0])
    if fits:
        features = w_shape[2] * 32 // bits
        groups = (w_shape[0], w_shape[1], features // group_size)
        fits = (features % group_size == 0 and tuple(s_shape) == groups
                and tuple(biases[0]) == groups and _slot_rows_fit(x, indices, features, per_slot))
    return "" if fits else "the native kernel does not cover these operands (dtypes, shapes)"


def gather_quantized_matmul(setting: Setting, x: mx.array, w: mx.array, scales: mx.array,
                            biases: mx.array | None, indices: mx.array, *, group_size: int,
                            bits: int, mode: str, per_slot: bool,
                            int8: bool) -> tuple[mx.array | None, str]:
    """Each slot's ``x @ dequantize(w[indices[..., j]]).T`` (MLX's affine
    experts) on the native kernel (int8: in int8 numerics), float32
    ``[..., k, N]``, and ""; or None and why it cannot run here."""
    reason = inactive_reason(setting) or gather_uncovered_reason(
        AVal.of(x), AVal.of(w), AVal.of(scales), None if biases is None else AVal.of(biases),
        AVal.of(indices), group_size, bits, mode, per_slot, int8)
    if reason:
        return None, reason
    record(setting, "gather_quantized_matmul")
    return active(setting).gather_quantized_matmul(
        x, w, scales, biases, indices, group_size=group_size, bits=bits, per_slot=per_slot,
        int8=int8), ""


def covers_ggml(x: AVal | None, blocks: AVal, ggml_type) -> bool:
    """Whether the native GGML kernels compute this case: ``blocks`` uint8
    ``[..., row_bytes]`` of whole blocks of ``ggml_type`` (a
    :class:`~mlxprog.ggml.types.GGMLType`), and for a matmul (``x`` given)
    ``blocks`` 2-D and a float ``x [..., K]`` with K its rows' length and
    no empty axis."""
    shape, dtype = blocks
    if dtype != mx.uint8 or not shape or shape[-1] % ggml_type.block_bytes or 0 in shape:
        return False
    if x is None:
        return True
    k = shape[-1] // ggml_type.block_bytes * ggml_type.block
    x_shape, x_dtype = x
    return (len(shape) == 2 and x_dtype in FLOATS and len(x_shape) >= 1
            and x_shape[-1] == k and 0 not in x_shape)


def _with_codebooks(native, ggml_type):
    """The extension, once the IQ types' codebooks are set in it (taken from
    the gguf package on first need: :mod:`mlxprog.ggml.codebooks`)."""
    global _codebooks_set
    if ggml_type.name.startswith("IQ") and not _codebooks_set:
        from ..ggml.codebooks import codebooks

        for name, table in codebooks().items():
            native.set_codebook(name, mx.array(table))
        _codebooks_set = True
    return native


_codebooks_set = False


def ggml_matmul(setting: Setting, x: mx.array, w: mx.array, ggml_type, *,
                int8: bool) -> mx.array | None:
    """``x @ dequantize(w).T`` on the native GGML kernel of ``ggml_type``
    (int8: llama.cpp's numerics), or None where it does not apply."""
    native = active(setting)
    if native is None or not covers_ggml(AVal.of(x), AVal.of(w), ggml_type):
        return None
    record(setting, "ggml_matmul")
    return _with_codebooks(native, ggml_type).ggml_matmul(x, w, type=ggml_type.id, int8=int8)


def covers_ggml_gather(x: AVal, w: AVal, indices: AVal, ggml_type, per_slot: bool) -> bool:
    """Whether the native GGML expert kernel computes this
    ``ggml_gather_matmul``: ``w`` uint8 ``[E, N, row_bytes]`` of whole blocks
    of ``ggml_type`` (no empty axis), and x and indices as
    :func:`_slot_rows_fit` reads them."""
    if len(w[0]) != 3 or not covers_ggml(None, w, ggml_type):
        return False
    features = w[0][-1] // ggml_type.block_bytes * ggml_type.block
    return _slot_rows_fit(x, indices, features, per_slot)


def ggml_gather_matmul(setting: Setting, x: mx.array, w: mx.array, indices: mx.array,
                       ggml_type, *, int8: bool, per_slot: bool) -> mx.array | None:
    """Each slot's ``x @ dequantize(w[indices[..., j]]).T`` on the native
    GGML expert kernel of ``ggml_type`` (int8: llama.cpp's numerics, x
    quantized once per row), float32 ``[..., k, N]``; or None where it does
    not apply."""
    native = active(setting)
    if native is None or not covers_ggml_gather(AVal.of(x), AVal.of(w), AVal.of(indices),
                                                ggml_type, per_slot):
        return None
    record(setting, "ggml_gather_matmul")
    return _with_codebooks(native, ggml_type).ggml_gather_matmul(
        x, w, indices, type=ggml_type.id, int8=int8, per_slot=per_slot)


def ggml_dequantize(setting: Setting, blocks: mx.array, ggml_type) -> mx.array | None:
    """Rows of ``ggml_type`` blocks as float32 on the native kernel, or None
    where it does not apply."""
    native = active(setting)
    if native is None or not covers_ggml(None, AVal.of(blocks), ggml_type):
        return None
    record(setting, "ggml_dequantize")
    return _with_codebooks(native, ggml_type).ggml_dequantize(blocks, type=ggml_type.id)


def covers_moe_route(logits: AVal) -> bool:
    """Whether the native router computes this ``moe_route``: float logits
    ``[..., E]`` (the op checks ``top_k <= E``)."""
    shape, dtype = logits
    return dtype in FLOATS and len(shape) >= 1


def moe_route(setting: Setting, logits: mx.array, *, top_k: int, scoring: str,
              renormalize: bool) -> tuple[mx.array, mx.array] | None:
    """The native ``moe_route`` (one node: indices uint32 and weights
    float32 ``[..., top_k]``), or None where it does not apply."""
    native = active(setting)
    if native is None or not covers_moe_route(AVal.of(logits)):
        return None
    record(setting, "moe_route")
    indices, weights = native.moe_route(logits, top_k=top_k,
                                        softmax_first=scoring == "softmax_topk",
                                        renormalize=renormalize)
    return indices, weights


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


def covers_swiglu(gate: AVal, up: AVal) -> bool:
    """Whether the native two-operand SwiGLU computes this case: float32
    gate and up of one non-empty shape (no broadcasting)."""
    return (gate[1] == mx.float32 and up[1] == mx.float32 and gate[0] == up[0]
            and len(gate[0]) >= 1 and 0 not in gate[0])


def swiglu(setting: Setting, gate: mx.array, up: mx.array) -> mx.array | None:
    """The native ``silu(gate) * up``, or None where it does not apply."""
    native = active(setting)
    if native is None or not covers_swiglu(AVal.of(gate), AVal.of(up)):
        return None
    record(setting, "fast_swiglu")
    return native.swiglu(gate, up)


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


def cache_geometry(caches: Sequence[AVal], kind: CacheKind) -> Geometry | None:
    """``(B, H_kv, S, D)`` of a KV cache the native attention reads, or None
    where it reads no such cache: exactly ``kind``'s arrays
    (:meth:`CacheKind.arrays <mlxprog.cache_kinds.CacheKind.arrays>`: float32
    k and v ``[B, H_kv, S, D]`` for a float cache), no dim zero, of a kind
    the kernels have a format for."""
    if kind.native_format() is None:
        return None
    try:
        geometry = kind.fit(caches)
    except ValueError:
        return None
    if 0 in geometry or [a[1] for a in caches] != [a.dtype for a in kind.arrays(geometry[3])]:
        return None
    return geometry


def _cache_format(native: Any, kind: CacheKind) -> Any:
    """The extension's ``CacheFormat`` of ``kind`` (its native format)."""
    return native.CacheFormat(**kind.native_format())


def covers_recent(recent: Sequence[AVal] | None, geometry: Geometry | None,
                  kind: CacheKind) -> bool:
    """Whether the native attention reads this recent ring of a cache of
    ``kind`` and ``geometry`` (``(B, H_kv, S, D)``, :func:`cache_geometry`):
    none, or of a quantized cache the ring ``k_recent, v_recent`` (float32
    ``[B, H_kv, R, D]``) and ``recent_slots`` (int32 ``[B, R]``), R >= 1."""
    if recent is None:
        return True
    return kind.quantized and RecentRing.of(recent, geometry) is not None


def covers_cache_attention(q: AVal, caches: Sequence[AVal], kind: CacheKind,
                           recent: Sequence[AVal] | None = None,
                           sinks: AVal | None = None) -> bool:
    """Whether the native attention computes this case: float32 queries
    ``[B, H, T, D]`` over a cache :func:`cache_geometry` reads, of q's B and
    D, with H a multiple of H_kv (the ``BHTD`` layout), a recent ring
    ``recent`` :func:`covers_recent` reads, and ``sinks`` none or a float
    ``[H]``."""
    (q_shape, q_dtype) = q
    geometry = cache_geometry(caches, kind)
    if geometry is None or q_dtype != mx.float32 or len(q_shape) != 4 or 0 in q_shape:
        return False
    B, H, T, D = q_shape
    if sinks is not None and (sinks.shape != (H,) or not is_floating(sinks.dtype)):
        return False
    return (geometry[0] == B and geometry[3] == D and H % geometry[1] == 0
            and covers_recent(recent, geometry, kind))


def cache_attention(setting: Setting, q: mx.array, caches: Sequence[mx.array],
                    start: mx.array, key_mask: mx.array | None, scale: float,
                    window: int | None, softcap: float | None, kind: CacheKind,
                    recent: Sequence[mx.array] | None = None,
                    sinks: mx.array | None = None) -> mx.array | None:
    """Attention of queries ``[B, H, T, D]`` over a cache of ``kind``
    (``caches``: its arrays, see :func:`cache_geometry`): query t sees key j
    when ``j <= start + t``, with a ``window`` also ``j > start + t -
    window``, and ``key_mask[b, j]``; a query that sees no key gets zeros.
    Scores ``s = q . k * scale`` are capped at ``softcap * tanh(s /
    softcap)`` when ``softcap`` is given.

    ``recent``: a quantized cache's recent ring of R tokens, ``(k_recent,
    v_recent, recent_slots, new_k, new_v)``: the ring (see
    :func:`covers_recent`) and the step's new keys and values (float32
    ``[B, H_kv, T, D]``), all in the cache's basis (with ``hadamard``
    each group's transform). Query t (slot ``p = start + t``) reads a key and
    value j it sees with ``p - j < R`` from ``new_k``/``new_v`` when ``j >=
    start``, else from the ring's entry ``j % R`` when ``recent_slots[b, j %
    R] == j``, else dequantized. The ring itself is not updated here.

    ``sinks`` ``[H]``: head h's attention-sink logit joins the softmax of
    each of its queries as one more score of no value (read as float32).

    The output ``[B, H, T, D]``, or None where the kernel does not apply."""
    native = active(setting)
    ring = _avals(None if recent is None else recent[:3])
    if native is None or not covers_cache_attention(
            AVal.of(q), [AVal.of(c) for c in caches], kind, ring,
            None if sinks is None else AVal.of(sinks)):
        return None
    if recent is not None:
        new_rows = AVal((*recent[0].shape[:2], q.shape[2], q.shape[3]), mx.float32)
        if len(recent) != 5 or any(AVal.of(a) != new_rows for a in recent[3:]):
            return None
        recent = list(recent)
    record(setting, kind.sdpa_op()[0])
    if key_mask is not None and key_mask.dtype != mx.bool_:
        key_mask = key_mask.astype(mx.bool_)
    # The kernel reads 0 as no window (every key up to the query's) and no cap.
    return native.cache_attention(q, list(caches), _int32_vector(start), key_mask,
                                  scale=scale, window=window or 0, softcap=softcap or 0.0,
                                  format=_cache_format(native, kind), recent=recent,
                                  sinks=None if sinks is None else sinks.astype(mx.float32))


def covers_cache_attention_block(qkv: AVal, caches: Sequence[AVal], kind: CacheKind,
                                 recent: Sequence[AVal] | None = None) -> bool:
    """Whether the native attention block computes this case: float32 qkv
    ``[B, T, F]`` with T >= 1 over a cache :func:`cache_geometry` reads, of
    qkv's B, with a recent ring ``recent`` :func:`covers_recent` reads;
    the op checks how F splits into heads."""
    (x_shape, x_dtype) = qkv
    geometry = cache_geometry(caches, kind)
    return (geometry is not None and x_dtype == mx.float32 and len(x_shape) == 3
            and 0 not in x_shape and x_shape[0] == geometry[0]
            and covers_recent(recent, geometry, kind))


def cache_attention_block(setting: Setting, qkv: mx.array, caches: Sequence[mx.array],
                          start: mx.array, positions: mx.array, *, heads: int, kv_heads: int,
                          dims: int, traditional: bool, base: float, rope_scale: float,
                          scale: float, freqs: mx.array | None, key_mask: mx.array | None,
                          kind: CacheKind,
                          recent: Sequence[mx.array] | None = None,
                          qk_norm: Sequence[mx.array] | None = None,
                          qk_norm_eps: float = 0.0) -> list[mx.array] | None:
    """The native ``kv_cache_attention_block`` (``start``: the clamped int32
    cache slot, ``positions``: int32 RoPE start positions, one or per row;
    ``caches``: the arrays of a cache of ``kind``, see
    :func:`cache_geometry`): the output, then the new cache arrays; or None
    where it does not apply. ``qk_norm``: the ``(q_norm, k_norm)`` weights
    ``[D]`` that RMS-norm each q and k head (eps ``qk_norm_eps``) before
    RoPE, or None.

    ``recent``: a quantized cache's recent ring ``(k_recent, v_recent,
    recent_slots)`` (:func:`covers_recent`), read as
    :func:`cache_attention` reads it with the block's own new keys (after
    RoPE) and values; then the results end with the updated ring: in row
    b, each new slot ``s >= start`` among the R up to the row's last new
    token that ``key_mask`` keeps, if the mask keeps ``s``, goes into entry
    ``s % R`` (its key and value in the cache's basis, and ``s``); without
    a mask, the step's last ``min(T, R)`` tokens."""
    native = active(setting)
    if native is None or not covers_cache_attention_block(
            AVal.of(qkv), [AVal.of(c) for c in caches], kind, _avals(recent)):
        return None
    if freqs is not None and freqs.dtype != mx.float32:
        return None
    record(setting, "kv_cache_attention_block")
    if key_mask is not None and key_mask.dtype != mx.bool_:
        key_mask = key_mask.astype(mx.bool_)
    return native.cache_attention_block(
        qkv, list(caches), start, positions, heads=heads, kv_heads=kv_heads, dims=dims,
        traditional=traditional, base=base, rope_scale=rope_scale, scale=scale, freqs=freqs,
        key_mask=key_mask, format=_cache_format(native, kind),
        recent=None if recent is None else list(recent), **_qk_norm(qk_norm, qk_norm_eps))


def _qk_norm(qk_norm: Sequence[mx.array] | None, eps: float) -> dict[str, Any]:
    """The native block's ``qk_norm`` arguments: the weights as float32 (qkv's
    dtype there) and their eps, or none."""
    if qk_norm is None:
        return {}
    return {"qk_norm": [w if w.dtype == mx.float32 else w.astype(mx.float32) for w in qk_norm],
            "qk_norm_eps": eps}


def transformer_layer_uncovered_reason(h: AVal, input_norm: AVal, post_norm: AVal,
                                       projections: dict[str, list[AVal]],
                                       caches: Sequence[AVal], *, group_size: int, bits: int,
                                       numerics: str, kind: CacheKind, ggml_parts=None,
                                       recent: Sequence[AVal] | None = None) -> str:
    """Why the native transformer layer cannot compute this case ("" when
    it can): it needs float32 h ``[B, T, hidden]``, a cache of ``kind``
    :func:`cache_geometry` reads, a recent ring ``recent`` (if any)
    :func:`covers_recent` reads, float norm weights, and projections the
    native quantized matmul covers (4- or 8-bit codes in int8 numerics) or
    (``ggml_parts``: each projection's parts' GGML type names) parts the
    native GGML kernels cover; the op checks how the shapes fit."""
    if h[1] != mx.float32 or len(h[0]) != 3 or 0 in h[0]:
        return f"the native layer needs a float32 h [B, T, hidden], found {h}"
    if not covers_cache_attention_block(AVal((h[0][0], h[0][1], 1), mx.float32), caches, kind):
        return ("the native layer needs a float32 cache [B, kv_heads, S, D] or a 4- or 8-bit "
                f"quantized one, found {', '.join(map(str, caches))}")
    if not covers_recent(recent, cache_geometry(caches, kind), kind):
        return ("the native layer needs a recent ring of a quantized cache [B, kv_heads, S, "
                "D]: k_recent and v_recent float32 [B, kv_heads, R, D], recent_slots int32 "
                f"[B, R], found {', '.join(map(str, recent))}")
    if input_norm[1] not in FLOATS or post_norm[1] not in FLOATS:
        return "the native layer needs float16, bfloat16 or float32 norm weights"
    if ggml_parts is not None:
        for (name, parts), types in zip(projections.items(), ggml_parts):
            for w, type_name in zip(parts, types):
                if not covers_ggml(None, w, ggml_types.BY_NAME[type_name]) or len(w[0]) != 2:
                    return f"the native GGML kernels do not cover projection {name}"
        return ""
    if numerics == "int8" and bits not in Q8_BITS:
        return f"int8 numerics need 4- or 8-bit codes, found {bits}"
    for name, (w, scales, biases) in projections.items():
        features = (w[0][1] * 32 // bits) if len(w[0]) == 2 else 0
        x = AVal((1, features), mx.float32)
        if not covers_quantized_matmul(x, w, scales, biases, True, group_size, bits, "affine"):
            return f"the native quantized matmul does not cover projection {name}"
    return ""


def transformer_layer(setting: Setting, h: mx.array, input_norm: mx.array, post_norm: mx.array,
                      projections: dict[str, list[mx.array]], caches: Sequence[mx.array], *,
                      start: mx.array, positions: mx.array, heads: int, kv_heads: int,
                      dims: int, traditional: bool, base: float, rope_scale: float,
                      scale: float, eps: float, group_size: int, bits: int, numerics: str,
                      freqs: mx.array | None, key_mask: mx.array | None, kind: CacheKind,
                      ggml_parts=None,
                      recent: Sequence[mx.array] | None = None,
                      qk_norm: Sequence[mx.array] | None = None,
                      qk_norm_eps: float = 0.0) -> list[mx.array] | None:
    """The native ``transformer_layer`` (``start``: the clamped int32 cache
    slot, ``positions``: int32 RoPE start positions; ``projections``: the
    (w, scales, biases) of qkv, o, gate_up and down, or with ``ggml_parts``
    (each projection's parts' GGML type names) their parts' blocks; ``caches``: the
    arrays of a cache of ``kind``, see :func:`cache_geometry`): h, then the
    new cache arrays, then with a recent ring ``recent`` (as
    :func:`cache_attention_block` takes it) the updated ring; or None where
    it does not apply. ``qk_norm``, ``qk_norm_eps``: as
    :func:`cache_attention_block` takes them."""
    native = active(setting)
    if native is None or (freqs is not None and freqs.dtype != mx.float32):
        return None
    avals = {name: [AVal.of(a) for a in parts] for name, parts in projections.items()}
    if transformer_layer_uncovered_reason(
            AVal.of(h), AVal.of(input_norm), AVal.of(post_norm), avals,
            [AVal.of(c) for c in caches], group_size=group_size, bits=bits, numerics=numerics,
            ggml_parts=ggml_parts, kind=kind, recent=_avals(recent)):
        return None
    record(setting, "transformer_layer")
    if key_mask is not None and key_mask.dtype != mx.bool_:
        key_mask = key_mask.astype(mx.bool_)
    if ggml_parts is not None:
        for types in ggml_parts:
            for type_name in types:
                _with_codebooks(native, ggml_types.BY_NAME[type_name])
        group_size, bits = 0, 0  # the parts' types say how they are packed
    return native.transformer_layer(
        h, input_norm, projections["qkv"], projections["o"], post_norm, projections["gate_up"],
        projections["down"], list(caches), start, positions, heads=heads,
        kv_heads=kv_heads, dims=dims, traditional=traditional, base=base,
        rope_scale=rope_scale, scale=scale, eps=eps, group_size=group_size, bits=bits,
        int8=numerics == "int8", freqs=freqs, key_mask=key_mask,
        part_types=None if ggml_parts is None else [
            [ggml_types.BY_NAME[t].id for t in types] for types in ggml_parts],
        format=_cache_format(native, kind), recent=None if recent is None else list(recent),
        **_qk_norm(qk_norm, qk_norm_eps))


def covers_matmul(a: AVal, b: AVal) -> bool:
    """Whether the native float32 matmul computes ``a @ b``: both float32,
    each of rank >= 1 (a 1-D operand is a row or column vector, as in MLX),
    inner sizes equal and batch dims that broadcast. It covers empty
    operands too (an empty K gives zeros). Inside a shapeless trace the
    primitive recomputes its shape for each binding."""
    (a_shape, a_dtype), (b_shape, b_dtype) = a, b
    if a_dtype != mx.float32 or b_dtype != mx.float32 or not a_shape or not b_shape:
        return False
    a_shape = a_shape if len(a_shape) > 1 else (1, *a_shape)
    b_shape = b_shape if len(b_shape) > 1 else (*b_shape, 1)
    if a_shape[-1] != b_shape[-2]:
        return False
    return all(x == y or 1 in (x, y) for x, y in zip(a_shape[-3::-1], b_shape[-3::-1]))


def matmul(setting: Setting, a: mx.array, b: mx.array, op: str = "matmul") -> mx.array | None:
    """The native ``mx.matmul`` for float32 operands, or None where it does
    not apply. Transposed (and other strided) views are read in place.
    ``op`` is the calling op, counted when the kernel runs."""
    native = active(setting)
    if native is None or not covers_matmul(AVal.of(a), AVal.of(b)):
        return None
    record(setting, op)
    # Vectors as one-row / one-column matrices: expand_dims and squeeze keep
    # the graph valid in a shapeless trace, where reshape would fix sizes.
    if a.ndim == 1 and b.ndim == 1:
        return mx.squeeze(native.matmul(mx.expand_dims(a, 0), mx.expand_dims(b, 1)), (0, 1))
    if a.ndim == 1:
        return mx.squeeze(native.matmul(mx.expand_dims(a, 0), b), -2)
    if b.ndim == 1:
        return mx.squeeze(native.matmul(a, mx.expand_dims(b, 1)), -1)
    return native.matmul(a, b)


def covers_conv(x: AVal, w: AVal, stride: list[int], padding: list[tuple[int, int]],
                kernel_dilation: list[int], input_dilation: list[int], groups: int,
                flip: bool) -> bool:
    """Whether the native convolution computes this ``conv_general``: float32
    input ``[N, *spatial, C_in]`` (1 to 3 spatial dims, no empty axis) and
    weight ``[C_out, *kernel, C_in / groups]``, no input dilation, no flip,
    groups > 1 only with 1 or 2 spatial dims (MLX's limit, kept so MLX
    still raises its error) and a result of at least one element per
    spatial dim. Attribute lists have one entry per spatial dim."""
    (x_shape, x_dtype), (w_shape, w_dtype) = x, w
    spatial = len(x_shape) - 2
    if x_dtype != mx.float32 or w_dtype != mx.float32 or not 1 <= spatial <= 3 \
            or len(w_shape) != len(x_shape) or flip or any(d != 1 for d in input_dilation):
        return False
    if groups < 1 or (groups > 1 and spatial > 2) or 0 in x_shape or 0 in w_shape:
        return False
    if x_shape[-1] != w_shape[-1] * groups or w_shape[0] % groups:
        return False
    for size, k, s, (lo, hi), d in zip(x_shape[1:-1], w_shape[1:-1], stride, padding,
                                       kernel_dilation):
        if size + lo + hi - ((k - 1) * d + 1) < 0:
            return False
    return True


def conv(setting: Setting, x: mx.array, w: mx.array, *, stride: list[int],
         padding: list[tuple[int, int]], kernel_dilation: list[int], input_dilation: list[int],
         groups: int, flip: bool, op: str, bias: mx.array | None = None,
         residual: mx.array | None = None, activation: str = "none") -> mx.array | None:
    """The native ``mx.conv_general`` (per-spatial-dim lists; ``padding`` as
    (low, high) pairs) plus ``bias`` (float32 ``[C_out]``, optional) and
    ``residual`` (float32, the result's shape, optional), then
    ``activation`` (``"none"`` or ``"relu"``), all applied as the kernel
    finishes each output tile; None where it does not apply. ``op`` is the
    calling op, counted when the kernel runs."""
    native = active(setting)
    if native is None or not covers_conv(AVal.of(x), AVal.of(w), stride, padding,
                                         kernel_dilation, input_dilation, groups, flip):
        return None
    if bias is not None and (bias.dtype != mx.float32 or bias.shape != (w.shape[0],)):
        return None
    if residual is not None and residual.dtype != mx.float32:
        return None
    record(setting, op)
    return native.conv(x, w, stride=list(stride), pad_low=[lo for lo, _ in padding],
                       pad_high=[hi for _, hi in padding], dilation=list(kernel_dilation),
                       groups=groups, bias=bias, residual=residual, activation=activation)


def _avals(arrays: Sequence[mx.array] | None) -> list[AVal] | None:
    """The avals of ``arrays``, or None."""
    return None if arrays is None else [AVal.of(a) for a in arrays]


def _int32_vector(a: mx.array) -> mx.array:
    """``a`` as a 1-D int32 array, adding graph nodes only where it is not one
    already (each node costs a few microseconds per evaluation on the CPU)."""
    if a.ndim != 1:
        a = a.reshape(-1)
    return a if a.dtype == mx.int32 else a.astype(mx.int32)




def covers_integer_matmul(a: AVal, b: AVal) -> bool:
    """Whether the native integer matmul computes ``matmul(a, b)`` by numpy's
    rules: integer operands (not bool) whose promoted dtype is an integer
    (int64 with uint64 promotes to float32), each of rank >= 1 (a 1-D ``a``
    is a row, a 1-D ``b`` a column), equal contracted sizes, and batch axes
    that broadcast. Empty axes and K = 0 are covered (an empty result, or
    zeros, as numpy gives)."""
    (a_shape, a_dtype), (b_shape, b_dtype) = a, b
    if a_dtype not in INTEGERS or b_dtype not in INTEGERS \
            or mx.result_type(a_dtype, b_dtype) not in INTEGERS:
        return False
    if not a_shape or not b_shape or a_shape[-1] != b_shape[-2 if len(b_shape) > 1 else 0]:
        return False
    # Batch axes pair from the right; zip drops the extra axes of the longer.
    return all(x == y or 1 in (x, y) for x, y in zip(reversed(a_shape[:-2]),
                                                    reversed(b_shape[:-2])))


def integer_matmul(setting: Setting, a: mx.array, b: mx.array, *,
                   op: str = "matmul") -> mx.array | None:
    """The exact ``matmul(a, b)`` of integer operands by numpy's rules (dtypes
    promote as MLX promotes them; 1-D operands; batch axes broadcast),
    wrapping modulo 2**bits of the result dtype as numpy does, or None where
    it does not apply. ``op`` is the calling op, counted when the kernel
    runs."""
    native = active(setting)
    if native is None or not covers_integer_matmul(AVal.of(a), AVal.of(b)):
        return None
    record(setting, op)
    dtype = mx.result_type(a.dtype, b.dtype)
    # The kernel takes [..., M, K] @ [..., K, N] of one dtype; a 1-D operand's
    # added axis is dropped from the result again, as numpy does.
    a2 = mx.expand_dims(a, 0) if a.ndim == 1 else a
    b2 = mx.expand_dims(b, -1) if b.ndim == 1 else b
    out = native.integer_matmul(a2 if a2.dtype == dtype else a2.astype(dtype),
                                b2 if b2.dtype == dtype else b2.astype(dtype),
                                isa=native.isa())
    added = [axis for axis, one_d in ((-2, a.ndim == 1), (-1, b.ndim == 1)) if one_d]
    return mx.squeeze(out, added) if added else out


WINDOW_REDUCTIONS = ("sum", "product", "max", "min")


def covers_window_reduce(x: AVal) -> bool:
    """Whether the native window reduction computes a ``window_sum``,
    ``window_product``, ``window_max`` or ``window_min`` of ``x``: float32 of
    rank >= 1 (any layout, window, stride, dilation and padding the op
    accepts; a non-contiguous ``x`` is copied first)."""
    (shape, dtype) = x
    return dtype == mx.float32 and len(shape) >= 1


def window_reduce(setting: Setting, x: mx.array, *, reduction: str, window: list[int],
                  strides: list[int], dilations: list[int], padding: list[tuple[int, int]],
                  op: str) -> mx.array | None:
    """XLA's reduce_window of ``x`` by ``reduction`` (one of
    :data:`WINDOW_REDUCTIONS`), per-axis attributes as the window ops take
    them, padding adding the reduction's identity (max and min propagate
    NaN), or None where the kernel does not apply. ``op`` is the calling op,
    counted when the kernel runs."""
    native = active(setting)
    if native is None or reduction not in WINDOW_REDUCTIONS \
            or not covers_window_reduce(AVal.of(x)):
        return None
    record(setting, op)
    return native.window_reduce(x, op=reduction, window=list(window), stride=list(strides),
                                dilation=list(dilations), pad_low=[lo for lo, _ in padding],
                                pad_high=[hi for _, hi in padding])
