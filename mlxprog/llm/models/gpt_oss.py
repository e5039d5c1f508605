"""The gpt_oss family: OpenAI's gpt-oss (20b, 120b), a mixture of experts.

A pre-norm decoder like llama's: ``h += o_proj(attn(rms_norm(h)))`` then
``h += moe(rms_norm(h))``. Attention has q/k/v/o biases, YaRN-scaled RoPE
(:func:`~.llama.yarn`; the rotated features times its attention factor)
and one learned attention-sink logit per query head, which joins each
query's softmax denominator and adds no value; the layers alternate
between a sliding window of ``sliding_window`` (128) tokens and the whole
context as ``layer_types`` says (even layers sliding by default). The
router is a Linear with a bias; each token takes its ``top_k`` largest
logits and weights those experts by their softmax. Each expert is a gated
MLP with biases and a clamped SwiGLU: ``(clip(up, -7, 7) + 1) * g *
sigmoid(1.702 g)`` with ``g = min(gate, 7)``.

Checkpoints: mlx-lm's layout (``mlp.experts.{gate,up,down}_proj`` stacked
``[E, out, in]`` with ``[E, out]`` biases, float or MLX-quantized, the
experts in mxfp4 as mlx-community publishes them); OpenAI's original
Hugging Face layout, re-laid at load (:meth:`GptOssFamily.hf_tensors`:
the fused ``gate_up_proj`` with gate and up rows interleaved, in MXFP4
``_blocks``/``_scales``, which are MLX's mxfp4 packing byte for byte, or
in bfloat16 ``[E, in, out]``); GGUF (architecture ``gpt-oss``: MXFP4
``ffn_*_exps`` with their biases, ``ffn_gate_inp`` router, ``attn_sinks``).
Hugging Face's YaRN takes its ``truncate`` setting (gpt-oss's is false:
the blend's bounds are not rounded); llama.cpp, and so a GGUF file, rounds
them (as mlx-lm does for every checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from ...arrays import name_of
from ...errors import ModelError
from ..config import ModelConfig, MoEConfig, Scoring
from ..spec import (BY_QUERY_HEAD, COLUMNS_BY_EXPERT_INTERMEDIATE, COLUMNS_BY_HEADS,
                    ROWS_BY_EXPERT_INTERMEDIATE, Split)
from .base import Family, GGUFMetadata, HFConfig, Weight
from .gemma2 import check_sliding_layers, hf_sliding_layers, positive
from .llama import LlamaDecoder, decoder_weights, rope_scaling_from_hf, yarn

if TYPE_CHECKING:
    from ...builder import Value
    from ..cache import LayerCache

#: The clamped SwiGLU's sigmoid slope (gpt-oss's code fixes it; configs do
#: not carry it).
SWIGLU_ALPHA = 1.702


@dataclass(frozen=True)
class GptOssConfig(MoEConfig):
    """A gpt-oss config: the mixture's settings (:class:`~mlxprog.llm.config.MoEConfig`,
    routed ``topk_softmax``, the experts as wide as ``intermediate_size``),
    the sliding window and which layers use it, the factor YaRN multiplies
    the rotated q/k features by, and the SwiGLU clamp ``swiglu_limit``."""

    router: Scoring = "topk_softmax"
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()
    rope_attention_factor: float = 1.0
    swiglu_limit: float = 7.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_sliding_layers(self)


def _always(c: ModelConfig) -> bool:
    return True


def _experts(name: str, gguf: str, shape, split: Split) -> Weight:
    """A layer's stacked expert projection ``[E, out, in]`` with its biases,
    split across ranks by every expert's intermediate features."""
    return Weight(f"layers.{{i}}.mlp.experts.{name}", shape,
                  hf=f"model.layers.{{i}}.mlp.experts.{name}", gguf=f"blk.{{i}}.{gguf}",
                  bias=_always, split=split)


#: The llama layout with biases on every attention projection, gpt-oss's
#: GGUF name of the pre-MLP norm, the experts in place of the MLP, and each
#: layer's router and attention sinks.
WEIGHTS = decoder_weights(
    qkv_bias=_always,
    o_proj=Weight("layers.{i}.self_attn.o_proj",
                  lambda c: (c.hidden_size, c.num_heads * c.head_dim),
                  hf="model.layers.{i}.self_attn.o_proj", gguf="blk.{i}.attn_output",
                  split=COLUMNS_BY_HEADS, bias=_always),
    post_attention_layernorm=Weight(
        "layers.{i}.post_attention_layernorm", lambda c: (c.hidden_size,),
        hf="model.layers.{i}.post_attention_layernorm", gguf="blk.{i}.post_attention_norm",
        matrix=False),
    gate_proj=_experts("gate_proj", "ffn_gate_exps",
                       lambda c: (c.num_experts, c.expert_intermediate_size, c.hidden_size),
                       ROWS_BY_EXPERT_INTERMEDIATE),
    up_proj=_experts("up_proj", "ffn_up_exps",
                     lambda c: (c.num_experts, c.expert_intermediate_size, c.hidden_size),
                     ROWS_BY_EXPERT_INTERMEDIATE),
    down_proj=_experts("down_proj", "ffn_down_exps",
                       lambda c: (c.num_experts, c.hidden_size, c.expert_intermediate_size),
                       COLUMNS_BY_EXPERT_INTERMEDIATE),
) + (
    Weight("layers.{i}.mlp.router", lambda c: (c.num_experts, c.hidden_size),
           hf="model.layers.{i}.mlp.router", gguf="blk.{i}.ffn_gate_inp", bias=_always,
           finite=True),
    Weight("layers.{i}.self_attn.sinks", lambda c: (c.num_heads,),
           hf="model.layers.{i}.self_attn.sinks", gguf="blk.{i}.attn_sinks", matrix=False,
           split=BY_QUERY_HEAD, hf_bare=True),
)


def _mxfp4_blocks(name: str, blocks: mx.array) -> mx.array:
    """OpenAI's MXFP4 ``_blocks`` tensor ``name``, uint8 ``[E, out, groups,
    16]`` (bytes of two e2m1 values, the low nibble first), as MLX's mxfp4
    ``uint32 [E, out, in / 8]``: the same bytes."""
    if blocks.dtype != mx.uint8 or blocks.ndim != 4 or blocks.shape[-1] != 16:
        raise ModelError(f"{name} is {name_of(blocks.dtype)} {tuple(blocks.shape)}, expected "
                         "MXFP4 blocks: uint8 [experts, out, in / 32, 16]")
    return blocks.view(mx.uint32).reshape(*blocks.shape[:-2], blocks.shape[-2] * 4)


def _check_hf_quantization(hf: HFConfig) -> HFConfig:
    """``config.json`` without its ``quantization_config`` where that names
    OpenAI's MXFP4 (read from the tensors); any other method is refused
    (by :meth:`~.base.HFConfig.common`)."""
    quantization = hf.raw.get("quantization_config")
    if isinstance(quantization, Mapping) and quantization.get("quant_method") == "mxfp4":
        return HFConfig({k: v for k, v in hf.raw.items() if k != "quantization_config"},
                        hf.tokenizer)
    return hf


class GptOssFamily(Family):
    """gpt-oss (see the module docstring)."""

    name = "gpt_oss"
    hf_model_types = ("gpt_oss",)
    gguf_architectures = ("gpt-oss",)

    def config_from_hf(self, hf: HFConfig) -> GptOssConfig:
        """gpt-oss ``config.json``: experts (``num_local_experts``,
        ``num_experts_per_tok``), ``sliding_window`` and ``layer_types``
        (even layers sliding without it), YaRN (or no) RoPE scaling,
        ``swiglu_limit``; OpenAI's MXFP4 ``quantization_config`` is read
        from the tensors."""
        hf = _check_hf_quantization(hf)
        fields = hf.common()
        n = fields["num_layers"]
        rope = rope_scaling_from_hf(hf, fields["rope_theta"], fields["head_dim"],
                                    allowed=("default", "yarn"))
        experts, used = hf.experts("num_local_experts", "num_experts_per_tok")
        return GptOssConfig(
            **fields, family=self.name, attention_bias=True, rope_scale=rope.scale,
            rope_freqs=rope.freqs, rope_attention_factor=rope.attention_factor,
            num_experts=experts, experts_per_token=used,
            expert_intermediate_size=fields["intermediate_size"],
            sliding_window=positive(hf.integer("sliding_window", 128),
                                    "config.json: sliding_window"),
            sliding_layers=hf_sliding_layers(hf, n, [i % 2 == 0 for i in range(n)]),
            swiglu_limit=positive(hf.number("swiglu_limit", 7.0), "config.json: swiglu_limit"))

    def config_from_gguf(self, gguf: GGUFMetadata) -> GptOssConfig:
        """gpt-oss GGUF metadata (llama.cpp's ``gpt-oss`` architecture):
        ``expert_count``, ``expert_used_count``, ``expert_feed_forward_length``,
        ``attention.sliding_window`` on even layers, YaRN from
        ``rope.scaling.*`` as llama.cpp applies it (bounds rounded outward;
        ``yarn_beta_fast``/``yarn_beta_slow`` 32 and 1 unless given);
        half-split RoPE (llama.cpp's NEOX)."""
        fields = gguf.common()
        arch = gguf.architecture
        gguf.require_full_rope(fields["head_dim"], "gpt_oss")
        fields["intermediate_size"] = gguf.integer("expert_feed_forward_length",
                                                   fields["intermediate_size"])
        rope: dict[str, Any] = {}
        kind = gguf.string("rope.scaling.type", "none")
        if kind == "yarn":
            for key in ("rope.scaling.attn_factor", "rope.scaling.yarn_attn_factor",
                        "rope.scaling.yarn_ext_factor", "rope.scaling.yarn_log_multiplier"):
                if gguf.get(key, None) is not None:
                    raise ModelError(f"GGUF metadata: {arch}.{key} is not supported by the "
                                     "gpt_oss family")
            scaling = yarn(fields["rope_theta"], fields["head_dim"],
                           _positive_key(gguf, "rope.scaling.factor", None),
                           _positive_key(gguf, "rope.scaling.original_context_length", None),
                           _positive_key(gguf, "rope.scaling.yarn_beta_fast", 32.0),
                           _positive_key(gguf, "rope.scaling.yarn_beta_slow", 1.0))
            rope = dict(rope_freqs=scaling.freqs, rope_attention_factor=scaling.attention_factor)
        elif kind != "none":
            raise ModelError(f"GGUF metadata: {arch}.rope.scaling.type {kind!r} is not "
                             "supported by the gpt_oss family (none, yarn)")
        n = fields["num_layers"]
        return GptOssConfig(
            **fields, **gguf.expert_fields(), family=self.name, rope_traditional=False,
            attention_bias=True,
            sliding_window=gguf.size("attention.sliding_window", 128),
            sliding_layers=tuple(i % 2 == 0 for i in range(n)), **rope)

    def weights(self, config: ModelConfig) -> tuple[Weight, ...]:
        """The gpt-oss layout (:data:`WEIGHTS`)."""
        return WEIGHTS

    def hf_tensors(self, tensors: dict[str, mx.array], config: ModelConfig
                   ) -> tuple[dict[str, mx.array], Mapping[str, str]]:
        """OpenAI's original expert tensors re-laid as mlx-lm's (the
        table's), labelled by the file's tensor and rows they came from:
        ``gate_up_proj`` (``_blocks``/``_scales`` in MXFP4, ``[E, 2I,
        in]``, or bfloat16 ``[E, in, 2I]``) split into gate (even rows) and
        up (odd rows), ``gate_up_proj_bias`` likewise; ``down_proj``
        (``_blocks``/``_scales``, or bfloat16 ``[E, I, out]``) and
        ``down_proj_bias`` renamed. Other tensors as stored."""
        out: dict[str, mx.array] = {}
        labels: dict[str, str] = {}
        for key, value in tensors.items():
            stem, _, last = key.rpartition(".")
            if not stem.endswith(".mlp.experts") or last not in _ORIGINAL_EXPERTS:
                out[key] = value
                continue
            projection, part = _ORIGINAL_EXPERTS[last]
            change = ""
            if part == "weight" and last in ("gate_up_proj", "down_proj"):
                value = value.swapaxes(-1, -2)  # bfloat16 [E, in, out] -> [E, out, in]
                change = ":transposed"
            elif last.endswith("_blocks"):
                value = _mxfp4_blocks(key, value)
            # Axis 1 holds the rows (outputs) of every part.
            if projection == "gate_up_proj":
                halves = {"gate_proj": (value[:, 0::2], "[:, 0::2]"),
                          "up_proj": (value[:, 1::2], "[:, 1::2]")}
            else:
                halves = {"down_proj": (value, "")}
            for name, (half, rows) in halves.items():
                if change and rows:  # the stored tensor's outputs are its last axis
                    rows = rows.replace("[:, ", "[..., ")
                out[f"{stem}.{name}.{part}"] = mx.contiguous(half)
                labels[f"{stem}.{name}.{part}"] = f"{key}{rows}{change}"
        return out, labels


#: OpenAI's original expert tensors: (fused projection, the part it holds).
_ORIGINAL_EXPERTS = {
    f"{projection}{suffix}": (projection, part)
    for projection in ("gate_up_proj", "down_proj")
    for suffix, part in (("", "weight"), ("_blocks", "weight"), ("_scales", "scales"),
                         ("_bias", "bias"))
}


def _positive_key(gguf: GGUFMetadata, key: str, default: float | None) -> float:
    """GGUF metadata ``<arch>.<key>``, a positive number (required without a
    ``default``)."""
    value = gguf.get(key) if default is None else gguf.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ModelError(f"GGUF metadata: {gguf.architecture}.{key} must be a positive "
                         f"number, got {value!r}")
    return float(value)


class GptOssDecoder(LlamaDecoder):
    """The gpt-oss forward pass: the llama decoder's projections (q/k/v
    fused where packed alike) and residual-add norms, with YaRN's rotated
    feature scale, the sinks and the sliding windows in each layer's
    attention, and the mixture of experts in place of the MLP. Across
    tensor-parallel ranks each holds its query heads' sinks and a block of
    every expert's intermediate features."""

    # The fused attention block and whole-layer op take no sinks, window or
    # rotated-feature scale.
    fused_attention = False
    c: GptOssConfig

    def rope_settings(self, i: int) -> dict[str, Any]:
        """YaRN's factor on the rotated features (the periods are the config's)."""
        return {"rotated_scale": self.c.rope_attention_factor}

    def attention(self, sb, i: int, x: Value, T, rope_offset, cache_offset, key_mask,
                  cache: LayerCache) -> tuple[Value, LayerCache]:
        """Layer ``i``'s attention with its sinks, over its sliding window
        on a sliding layer."""
        c = self.c
        q, k, v = self.qkv(sb, i, x, T, rope_offset)
        return self.attend(sb, q, k, v, T, cache_offset, key_mask, cache,
                           sinks=self.weight(f"layers.{i}.self_attn.sinks.weight"),
                           window=c.sliding_window if c.sliding_layers[i] else None)

    def mlp(self, sb, i: int, x: Value) -> Value:
        """Layer ``i``'s mixture of experts on the normed ``x``: the
        router's top-k logits, softmaxed, weight the chosen experts' clamped
        SwiGLU MLPs."""
        c, p = self.c, f"layers.{i}.mlp"
        indices, weights = self.route(sb, f"{p}.router", x)
        gate = sb.min(self.expert_linear(sb, f"{p}.experts.gate_proj", x, indices),
                      c.swiglu_limit)
        up = sb.clip(self.expert_linear(sb, f"{p}.experts.up_proj", x, indices),
                     -c.swiglu_limit, c.swiglu_limit)
        glu = (up + 1.0) * (gate * sb.sigmoid(gate * SWIGLU_ALPHA))
        down = self.expert_linear(sb, f"{p}.experts.down_proj", glu, indices, per_slot=True,
                                  bias=False)
        slot_weights = sb.expand_dims(weights, axes=[-1])
        y = sb.sum(down * slot_weights, axes=[-2])
        if self.shard.world_size > 1:  # each rank's share of every expert's features
            y = sb.all_sum(y)
        # The down projection's biases, weighted as their experts' outputs (once).
        bias = sb.take(sb.astype(self.weight(f"{p}.experts.down_proj.bias"), dtype="float32"),
                       indices, axis=0)
        return y + sb.sum(bias * slot_weights, axes=[-2])


GptOssFamily.decoder = GptOssDecoder
FAMILY = GptOssFamily()
