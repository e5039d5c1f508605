"""Mixture-of-experts ops: routing tokens to experts (``moe_route``) and the
matmuls over the experts each token was routed to, with float experts
(``gather_matmul``), MLX-quantized ones (``gather_quantized_matmul``) and
GGUF's block-quantized ones (``ggml_gather_matmul``).

Shapes: ``E`` experts, ``k`` active per token, ``K`` input and ``N`` output
features. A token's ``k`` "slots" are its selected experts in descending
router-score order (``moe_route``'s ``indices [..., k]``). The gathered
matmuls take the experts stacked as one ``[E, N, K]`` weight ("out, in" per
expert, like a Linear weight) and return float32 ``[..., k, N]``: one row
per slot, from the token's one input row (``per_slot`` false, e.g. the gate
and up projections) or from one input row per slot (``per_slot`` true, the
down projection). Each op is one instruction whatever E, k and the number of
tokens: a decode step's graph holds no node per expert.
"""

from __future__ import annotations

import math
from typing import Literal

import mlx.core as mx
from pydantic import model_validator

from ..arrays import AVal, is_integer
from ..ggml.dequantize import dequantize as dequantize_blocks
from ..native import kernels as native
from ..native import record_numerics_fallback
from .attrs import Attrs, CheckError, PositiveInt
from .ggml import GGMLAttrs, row_elements
from .index import clamp_index
from .quant import Numerics, QuantAttrs, check_operands
from .registry import register_op

_FLOATS = (mx.float16, mx.bfloat16, mx.float32)
_FLOAT_NAMES = "float16, bfloat16 or float32"

# From this many slots on (a prefill), the exact paths sort the slots by
# expert first, as mlx-lm does: MLX's gathered matmuls then read each
# expert's weights once for a run of rows (sorted_indices).
_SORT_FROM_SLOTS = 64


class MoeRouteAttrs(Attrs):
    """The attributes of ``moe_route``."""

    top_k: PositiveInt
    """Experts per token (k), at most the number of experts E."""
    scoring: Literal["softmax_topk", "topk_softmax"]
    """``softmax_topk``: softmax over all E logits, keep the k largest
    probabilities (Qwen2/3-MoE, OLMoE); ``topk_softmax``: keep the k largest
    logits, softmax over those (Mixtral, gpt-oss)."""
    renormalize: bool = False
    """With ``softmax_topk``: divide the k kept probabilities by their sum."""

    @model_validator(mode="after")
    def _renormalize_needs_softmax_first(self):
        if self.renormalize and self.scoring != "softmax_topk":
            raise ValueError("renormalize applies to scoring 'softmax_topk' only (topk_softmax's "
                             "weights already sum to 1)")
        return self


def _check_moe_route(avals: list[AVal], attrs: MoeRouteAttrs) -> None:
    """logits float ``[..., E]`` with ``top_k <= E``."""
    logits = avals[0]
    if logits.dtype not in _FLOATS or not logits.shape:
        raise ValueError(f"logits must be {_FLOAT_NAMES} [..., E]; found {logits}")
    experts = logits.shape[-1]
    if attrs.top_k > experts:
        raise CheckError(f"top_k {attrs.top_k} is more than the {experts} experts of the "
                         f"logits {logits}", attribute="top_k")


def _moe_route_shape(avals: list[AVal], attrs: MoeRouteAttrs) -> list[AVal]:
    lead = avals[0].shape[:-1]
    return [AVal((*lead, attrs.top_k), mx.uint32), AVal((*lead, attrs.top_k), mx.float32)]


def _ranking_keys(scores: mx.array) -> mx.array:
    """uint64 keys whose ascending order is ``scores`` (float32) descending,
    equal scores by ascending position along the last axis, NaN above every
    number: the high 32 bits the scores' order-preserving bit pattern
    (inverted), the low 32 bits the position. Sorting these is
    deterministic on every device, whether or not its sort is stable."""
    ranked = mx.where(mx.isnan(scores), mx.array(math.inf, mx.float32), scores) + 0.0  # -0 -> +0
    bits = ranked.view(mx.uint32)
    negative = (bits >> 31) == 1
    ascending = mx.where(negative, ~bits, bits | mx.array(0x80000000, mx.uint32))
    position = mx.arange(scores.shape[-1], dtype=mx.uint64)
    return ((~ascending).astype(mx.uint64) << 32) | position


def _native_moe_route(avals: list[AVal], attrs: MoeRouteAttrs) -> bool:
    """Whether the native router computes this instruction."""
    return native.covers_moe_route(avals[0])


@register_op("moe_route", attrs=MoeRouteAttrs, operands=1, outputs=2, check=_check_moe_route,
             shape_rule=_moe_route_shape, native_coverage=_native_moe_route, context=True)
def moe_route(operands, attrs, context):
    """Route each token to its ``top_k`` experts: operand ``logits`` (the
    router's output, float ``[..., E]``); results ``indices`` uint32
    ``[..., k]`` (the chosen experts, highest score first; equal scores in
    ascending expert order, on every device) and ``weights`` float32
    ``[..., k]`` (each expert's share of the token's output). Scores are
    computed in float32.

    ``scoring``:

    - ``"softmax_topk"``: ``p = softmax(logits)`` over all E experts; the k
      largest ``p`` are kept and are the weights (with ``renormalize``,
      divided by their sum);
    - ``"topk_softmax"``: the k largest logits are kept; the weights are
      their softmax.

    NaN: a NaN ranks above every number, and a token with a NaN among its
    logits gets NaN for all its k weights (so its mixture is NaN, never a
    finite value from an arbitrarily picked expert); its indices are still
    experts in range. An infinite logit makes its token's weights NaN too
    (softmax of infinities); ``-inf`` logits are fine while the token has a
    finite one (the expert is never picked before a finite one).

    On the CPU with native kernels it is one node (mlxprog's router: the
    same rules, its own float32 softmax); elsewhere MLX ops."""
    routed = native.moe_route(context.native, operands[0], top_k=attrs.top_k,
                              scoring=attrs.scoring, renormalize=attrs.renormalize)
    if routed is not None:
        return routed
    logits = operands[0].astype(mx.float32)
    k = attrs.top_k
    scores = mx.softmax(logits, axis=-1) if attrs.scoring == "softmax_topk" else logits
    indices = mx.argsort(_ranking_keys(scores), axis=-1)[..., :k]
    kept = mx.take_along_axis(scores, indices, axis=-1)
    if attrs.scoring == "topk_softmax":
        weights = mx.softmax(kept, axis=-1)
    elif attrs.renormalize:
        weights = kept / kept.sum(axis=-1, keepdims=True)
    else:
        weights = kept
    return indices.astype(mx.uint32), weights


class SlotAttrs(Attrs):
    """Whether a gathered matmul takes one input row per token or per slot."""

    per_slot: bool = False
    """false: x is ``[..., K]``, one row per token, multiplied by each of its
    k experts; true: x is ``[..., k, K]``, one row per slot (e.g. the down
    projection's input)."""


def _check_slots(x: AVal, indices: AVal, attrs: SlotAttrs, experts: int,
                 features: int) -> None:
    """x float ``[..., K]`` (or ``[..., k, K]`` per slot) of ``features``
    (K), integer ``indices [..., k]`` with the same leading dims, and
    experts to pick from where any slot picks one."""
    if x.dtype not in _FLOATS:
        raise ValueError(f"x must be {_FLOAT_NAMES}; found {x}")
    if not is_integer(indices.dtype) or not indices.shape:
        raise ValueError(f"indices must be an integer [..., k] array (moe_route's); "
                         f"found {indices}")
    want = (*indices.shape, features) if attrs.per_slot else (*indices.shape[:-1], features)
    if tuple(x.shape) != want:
        layout = "[..., k, K]" if attrs.per_slot else "[..., K]"
        raise ValueError(f"x must be {layout} {list(want)} for indices {indices} and experts of "
                         f"{features} input features (per_slot={str(attrs.per_slot).lower()}); "
                         f"found {x}")
    if experts == 0 and math.prod(indices.shape):
        raise ValueError("w holds no expert for the indices to pick")


def _gathered_shape(indices: AVal, n: int) -> list[AVal]:
    """A gathered matmul's result: float32 ``[..., k, N]``."""
    return [AVal((*indices.shape, n), mx.float32)]


def _slot_rows(x: mx.array, per_slot: bool) -> mx.array:
    """x as the gathered matmuls' left operand: ``[..., 1, 1, K]`` (one row
    broadcast over the slots) or ``[..., k, 1, K]``."""
    return mx.expand_dims(x, -2) if per_slot else mx.expand_dims(x, (-2, -3))


def _gathered_product(x: mx.array, indices: mx.array, per_slot: bool, experts: int,
                      product) -> mx.array:
    """``product(rows, expert_indices, sorted_indices)`` (a gathered matmul
    of MLX) for every slot, as float32 ``[..., k, N]``: ``rows [S, 1, K]``
    and ``expert_indices [S]`` (S slots) sorted by expert when there are
    many slots, else ``[..., 1 or k, 1, K]`` and ``[..., k]`` as they are."""
    expert_indices = clamp_index(indices, experts)
    if indices.size < _SORT_FROM_SLOTS:
        y = product(_slot_rows(x, per_slot), expert_indices, False)
        return mx.squeeze(y, -2).astype(mx.float32)
    k, features = indices.shape[-1], x.shape[-1]
    flat = expert_indices.reshape(-1)
    order = mx.argsort(flat)
    source = order if per_slot else order // k
    rows = mx.take(x.reshape(-1, features), source, axis=0)
    y = product(mx.expand_dims(rows, -2), mx.take(flat, order), True)
    unsorted = mx.take(mx.squeeze(y, -2), mx.argsort(order), axis=0)
    return unsorted.reshape(*indices.shape, -1).astype(mx.float32)


def _check_gather_matmul(avals: list[AVal], attrs: SlotAttrs) -> None:
    """x float ``[..., K]`` / ``[..., k, K]``, w float ``[E, N, K]``,
    integer indices ``[..., k]``."""
    x, w, indices = avals
    if w.dtype not in _FLOATS or len(w.shape) != 3:
        raise ValueError(f"w must be {_FLOAT_NAMES} [E, N, K] (the experts' weights); found {w}")
    _check_slots(x, indices, attrs, w.shape[0], w.shape[2])


def _gather_matmul_shape(avals: list[AVal], attrs: SlotAttrs) -> list[AVal]:
    return _gathered_shape(avals[2], avals[1].shape[1])


@register_op("gather_matmul", attrs=SlotAttrs, operands=3, check=_check_gather_matmul,
             shape_rule=_gather_matmul_shape)
def gather_matmul(operands, attrs):
    """The matmul of each slot's expert, float experts: operands ``x``
    (``[..., K]``, or ``[..., k, K]`` with ``per_slot``), ``w`` ``[E, N,
    K]`` (each expert's ``[N, K]`` weight, as a Linear stores it) and
    ``indices`` ``[..., k]`` (``moe_route``'s). Result float32 ``[..., k,
    N]``: ``y[..., j, :] = x(_j) @ w[indices[..., j]].T``. x and w are
    float16, bfloat16 or float32, multiplied in their promoted dtype and
    accumulated in float32. Negative indices count from the end; out-of-range
    ones are clamped. Runs MLX's ``gather_mm`` (on the CPU, whose
    ``gather_mm`` takes float32 only, half-precision experts are multiplied
    in float32: the chosen ones, or all of them once when there are at least
    as many slots as experts)."""
    x, w, indices = operands
    if mx.default_device() == mx.cpu and mx.result_type(x.dtype, w.dtype) != mx.float32:
        return _float32_experts_product(x.astype(mx.float32), w, indices, attrs.per_slot,
                                        lambda experts: experts.astype(mx.float32))

    def product(rows, expert_indices, sorted_indices):
        return mx.gather_mm(rows, w.swapaxes(-1, -2), rhs_indices=expert_indices,
                            sorted_indices=sorted_indices)

    return _gathered_product(x, indices, attrs.per_slot, w.shape[0], product)


def _float32_experts_product(x: mx.array, w: mx.array, indices: mx.array, per_slot: bool,
                             to_float32) -> mx.array:
    """Every slot's product with its expert as float32 ``[..., k, N]``, the
    experts ``w`` ``[E, ...]`` made float32 ``[E, N, K]`` by
    ``to_float32``: only the chosen ones (a decode step), or all of them
    once when there are at least as many slots as experts (a prefill)."""
    experts = w.shape[0]
    if indices.size >= experts:
        every_expert = to_float32(w)

        def product(rows, expert_indices, sorted_indices):
            return mx.gather_mm(rows, every_expert.swapaxes(-1, -2), rhs_indices=expert_indices,
                                sorted_indices=sorted_indices)

        return _gathered_product(x, indices, per_slot, experts, product)
    chosen = to_float32(mx.take(w, clamp_index(indices, experts), axis=0))
    rows = _slot_rows(x, per_slot).swapaxes(-1, -2)  # [..., 1 or k, K, 1]
    return mx.squeeze(mx.matmul(chosen, rows), -1)


class GatherQuantizedMatmulAttrs(QuantAttrs, SlotAttrs):
    """The attributes of ``gather_quantized_matmul``."""

    numerics: Numerics = "exact"
    """As ``quantized_matmul``'s: ``exact`` float products of x with the
    dequantized weights (MLX's), ``int8`` x quantized per group and integer
    dot products."""

    def operand_names(self) -> tuple[str, ...]:
        return ("x", *self.parts(), "indices")


def _check_gather_quantized_matmul(avals: list[AVal], attrs: GatherQuantizedMatmulAttrs) -> None:
    """x float, the experts' packed ``w [E, N, K * bits / 32]`` with its
    scales (and biases) ``[E, N, K / group_size]``, integer indices."""
    check_operands(avals, attrs)
    named = dict(zip(attrs.operand_names(), avals))
    w = named["w"]
    group_size, bits = attrs.resolved()
    if w.dtype != mx.uint32 or len(w.shape) != 3:
        raise ValueError(f"w must be uint32 [E, N, K * bits / 32] (packed experts); found {w}")
    features = w.shape[2] * 32 // bits
    groups = (*w.shape[:2], features // group_size)
    scale_dtypes = _FLOATS if attrs.mode == "affine" else (mx.uint8,)
    for name in attrs.parts()[1:]:
        part = named[name]
        if tuple(part.shape) != groups or part.dtype not in scale_dtypes:
            dtypes = _FLOAT_NAMES if attrs.mode == "affine" else "uint8"
            raise ValueError(f"{name} must be {dtypes} {list(groups)} (one per group of "
                             f"{group_size} of w's {features} input features); found {part}")
    _check_slots(named["x"], named["indices"], attrs, w.shape[0], features)


def _gather_quantized_matmul_shape(avals: list[AVal],
                                   attrs: GatherQuantizedMatmulAttrs) -> list[AVal]:
    named = dict(zip(attrs.operand_names(), avals))
    return _gathered_shape(named["indices"], named["w"].shape[1])


def _native_gather_quantized_matmul(avals: list[AVal], attrs: GatherQuantizedMatmulAttrs) -> bool:
    """Whether the native kernel computes this instruction (in int8
    numerics: the int8 one)."""
    named = dict(zip(attrs.operand_names(), avals))
    group_size, bits = attrs.resolved()
    return not native.gather_uncovered_reason(
        named["x"], named["w"], named["scales"], named.get("biases"), named["indices"],
        group_size, bits, attrs.mode, attrs.per_slot, attrs.numerics == "int8")


@register_op("gather_quantized_matmul", attrs=GatherQuantizedMatmulAttrs, operands=(4, 5),
             check=_check_gather_quantized_matmul, shape_rule=_gather_quantized_matmul_shape,
             native_coverage=_native_gather_quantized_matmul, context=True)
def gather_quantized_matmul(operands, attrs, context):
    """``gather_matmul`` with MLX-quantized experts, as mlx-lm stores them
    (``switch_mlp``): operands ``x`` (``[..., K]``, or ``[..., k, K]`` with
    ``per_slot``), ``w`` uint32 ``[E, N, K * bits / 32]``, ``scales`` and,
    in ``"affine"`` mode, ``biases`` ``[E, N, K / group_size]`` (the
    ``quantize`` op's results for ``[E, N, K]`` experts; mxfp4 for
    gpt-oss), then ``indices`` ``[..., k]``. Result float32 ``[..., k, N]``:
    ``y[..., j, :] = x(_j) @ dequantize(w[indices[..., j]]).T``. Negative
    indices count from the end; out-of-range ones are clamped.

    ``numerics`` as ``quantized_matmul``'s. On the CPU with native kernels
    (affine mode with the native quantized matmul's bits, 4 or 8 for
    ``"int8"``) it runs mlxprog's kernel, which reads only the chosen
    experts, each once for the slots of all the tokens that chose it;
    elsewhere MLX's ``gather_qmm`` (transposed), where ``"int8"`` computes
    ``"exact"`` and ``exe.stats.numerics_fallbacks`` counts it, with the
    reason."""
    named = dict(zip(attrs.operand_names(), operands))
    w, scales, biases = named["w"], named["scales"], named.get("biases")
    group_size, bits = attrs.resolved()
    int8 = attrs.numerics == "int8"
    result, reason = native.gather_quantized_matmul(
        context.native, named["x"], w, scales, biases, named["indices"], group_size=group_size,
        bits=bits, mode=attrs.mode, per_slot=attrs.per_slot, int8=int8)
    if result is not None:
        return result
    if int8:
        record_numerics_fallback(context.native, "gather_quantized_matmul",
                                 f"int8 computed exactly: {reason}")

    def product(rows, expert_indices, sorted_indices):
        return mx.gather_qmm(rows, w, scales, biases, rhs_indices=expert_indices, transpose=True,
                             sorted_indices=sorted_indices, **attrs.quant_kwargs())

    return _gathered_product(named["x"], named["indices"], attrs.per_slot, w.shape[0], product)


class GGMLGatherMatmulAttrs(GGMLAttrs, SlotAttrs):
    """The attributes of ``ggml_gather_matmul``."""

    numerics: Numerics = "int8"
    """As ``ggml_matmul``'s: ``int8`` llama.cpp's integer dot products,
    ``exact`` float32 products of the exact dequantization."""


def _check_ggml_gather_matmul(avals: list[AVal], attrs: GGMLGatherMatmulAttrs) -> None:
    """x float ``[..., K]`` / ``[..., k, K]``, w uint8 ``[E, N, row_bytes]``
    of whole blocks, integer indices."""
    x, w, indices = avals
    if len(w.shape) != 3:
        raise ValueError(f"w must be a 3-D uint8 [E, N, row_bytes] (GGUF's expert tensor); "
                         f"found {w}")
    _check_slots(x, indices, attrs, w.shape[0], row_elements(w, attrs, "w"))


def _ggml_gather_matmul_shape(avals: list[AVal], attrs: GGMLGatherMatmulAttrs) -> list[AVal]:
    return _gathered_shape(avals[2], avals[1].shape[1])


def _native_ggml_gather_matmul(avals: list[AVal], attrs: GGMLGatherMatmulAttrs) -> bool:
    """Whether the native kernel computes this instruction."""
    return native.covers_ggml_gather(*avals, attrs.ggml, attrs.per_slot)


@register_op("ggml_gather_matmul", attrs=GGMLGatherMatmulAttrs, operands=3,
             check=_check_ggml_gather_matmul, shape_rule=_ggml_gather_matmul_shape,
             native_coverage=_native_ggml_gather_matmul, context=True)
def ggml_gather_matmul(operands, attrs, context):
    """``gather_matmul`` with GGML block-quantized experts (GGUF's ``*_exps``
    tensors): operands ``x`` (``[..., K]``, or ``[..., k, K]`` with
    ``per_slot``), ``w`` uint8 ``[E, N, row_bytes]`` (each expert's rows of
    ``type`` blocks exactly as the file stores them, as ``ggml_matmul``
    takes a matrix) and ``indices`` ``[..., k]``. Result float32 ``[..., k,
    N]``: ``y[..., j, :] = x(_j) @ dequantize(w[indices[..., j]]).T``.
    Negative indices count from the end; out-of-range ones are clamped.

    ``numerics`` as ``ggml_matmul``'s (``"int8"``, the default, quantizes
    each row of x once, not once per slot). On the CPU with native kernels
    it runs the type's kernels on the chosen experts' rows only, the slots
    grouped by expert so that each expert's rows are read once for all the
    tokens that chose it. Elsewhere the chosen experts' blocks are
    dequantized with MLX ops (all experts once, when there are at least as
    many slots as experts) and multiplied in float32 (int8 numerics then
    compute ``"exact"``, and ``exe.stats.numerics_fallbacks`` counts it)."""
    x, w, indices = operands
    t = attrs.ggml
    result = native.ggml_gather_matmul(context.native, x, w, indices, t,
                                       int8=attrs.numerics == "int8", per_slot=attrs.per_slot)
    if result is not None:
        return result
    if attrs.numerics == "int8":
        reason = (native.inactive_reason(context.native)
                  or "the native kernel does not cover these operands (dtypes, shapes)")
        record_numerics_fallback(context.native, "ggml_gather_matmul",
                                 f"int8 computed exactly: {reason}")
    return _float32_experts_product(x.astype(mx.float32), w, indices, attrs.per_slot,
                                    lambda blocks: dequantize_blocks(t.name, blocks))
