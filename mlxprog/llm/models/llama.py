"""The llama family: Llama (1-3, SmolLM2), Mistral and Qwen2.

A pre-norm decoder: each layer is ``h += attn(rms_norm(h))`` then
``h += mlp(rms_norm(h))``, with grouped-query attention (RoPE on q and k)
and a SwiGLU MLP; Qwen2 adds q/k/v biases. Hugging Face checkpoints use
the half-split RoPE layout; llama.cpp's converter permutes Llama's Q/K rows
into the interleaved one (``traditional``), but not Qwen2's.

This module's decoder is also the fast path the other families borrow
from: fused q/k/v and gate/up projections, the attention block and the whole
``transformer_layer`` op (one graph node per layer on the CPU).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import mlx.core as mx

from ...errors import ModelError
from ..checkpoint import GGMLQuantization, Quantization
from ..config import ModelConfig
from ..spec import (COLUMNS_BY_HEADS, COLUMNS_BY_INTERMEDIATE, ROWS_BY_HEADS,
                    ROWS_BY_INTERMEDIATE, ROWS_BY_KV_HEADS)
from .base import Decoder, Family, GGUFMetadata, HFConfig, Weight, gguf_expert_count

if TYPE_CHECKING:
    from ...builder import Value
    from ..cache import LayerCache


def _q_out(c: ModelConfig) -> int:
    return c.num_heads * c.head_dim


def _kv_out(c: ModelConfig) -> int:
    return c.num_kv_heads * c.head_dim


def _attention_bias(c: ModelConfig) -> bool:
    return c.attention_bias


def _untied(c: ModelConfig) -> bool:
    return not c.tie_embeddings


def decoder_weights(*, qkv_bias=_attention_bias, **changes: Weight) -> tuple[Weight, ...]:
    """The llama layout's weight table (embeddings, per-layer norms and
    projections, final norm, head); ``changes`` replace entries by their
    short key (``q_proj``, ``input_layernorm``, ...) so that a family built
    on the layout lists only what differs."""
    table = {
        "embed_tokens": Weight("embed_tokens", lambda c: (c.vocab_size, c.hidden_size),
                               hf="model.embed_tokens", gguf="token_embd"),
        "input_layernorm": Weight("layers.{i}.input_layernorm", lambda c: (c.hidden_size,),
                                  hf="model.layers.{i}.input_layernorm",
                                  gguf="blk.{i}.attn_norm", matrix=False),
        "q_proj": Weight("layers.{i}.self_attn.q_proj", lambda c: (_q_out(c), c.hidden_size),
                         hf="model.layers.{i}.self_attn.q_proj", gguf="blk.{i}.attn_q",
                         split=ROWS_BY_HEADS, bias=qkv_bias),
        "k_proj": Weight("layers.{i}.self_attn.k_proj", lambda c: (_kv_out(c), c.hidden_size),
                         hf="model.layers.{i}.self_attn.k_proj", gguf="blk.{i}.attn_k",
                         split=ROWS_BY_KV_HEADS, bias=qkv_bias),
        "v_proj": Weight("layers.{i}.self_attn.v_proj", lambda c: (_kv_out(c), c.hidden_size),
                         hf="model.layers.{i}.self_attn.v_proj", gguf="blk.{i}.attn_v",
                         split=ROWS_BY_KV_HEADS, bias=qkv_bias),
        "o_proj": Weight("layers.{i}.self_attn.o_proj", lambda c: (c.hidden_size, _q_out(c)),
                         hf="model.layers.{i}.self_attn.o_proj", gguf="blk.{i}.attn_output",
                         split=COLUMNS_BY_HEADS),
        "post_attention_layernorm": Weight(
            "layers.{i}.post_attention_layernorm", lambda c: (c.hidden_size,),
            hf="model.layers.{i}.post_attention_layernorm", gguf="blk.{i}.ffn_norm",
            matrix=False),
        "gate_proj": Weight("layers.{i}.mlp.gate_proj",
                            lambda c: (c.intermediate_size, c.hidden_size),
                            hf="model.layers.{i}.mlp.gate_proj", gguf="blk.{i}.ffn_gate",
                            split=ROWS_BY_INTERMEDIATE),
        "up_proj": Weight("layers.{i}.mlp.up_proj", lambda c: (c.intermediate_size, c.hidden_size),
                          hf="model.layers.{i}.mlp.up_proj", gguf="blk.{i}.ffn_up",
                          split=ROWS_BY_INTERMEDIATE),
        "down_proj": Weight("layers.{i}.mlp.down_proj",
                            lambda c: (c.hidden_size, c.intermediate_size),
                            hf="model.layers.{i}.mlp.down_proj", gguf="blk.{i}.ffn_down",
                            split=COLUMNS_BY_INTERMEDIATE),
        "norm": Weight("norm", lambda c: (c.hidden_size,), hf="model.norm", gguf="output_norm",
                       matrix=False),
        "lm_head": Weight("lm_head", lambda c: (c.vocab_size, c.hidden_size), hf="lm_head",
                          gguf="output", present=_untied),
    }
    unknown = set(changes) - set(table)
    if unknown:
        raise ValueError(f"decoder_weights: no entries {sorted(unknown)}")
    table.update(changes)
    return tuple(table.values())


class RopeScaling(NamedTuple):
    """A RoPE scaling as the decoder applies it: positions times ``scale``;
    ``freqs`` the per-pair periods (None: ``theta ** (2i / dims)``);
    ``attention_factor`` multiplies the rotated features of q and k before
    the rotation (YaRN's ``mscale``: the scores grow by its square)."""

    scale: float = 1.0
    freqs: tuple[float, ...] | None = None
    attention_factor: float = 1.0


def yarn_attention_factor(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention factor of a context stretched ``factor`` times:
    ``0.1 * mscale * ln(factor) + 1`` (1 without stretching)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn(theta: float, dims: int, factor: float, original_context: float,
         beta_fast: float = 32.0, beta_slow: float = 1.0, truncate: bool = True,
         attention_factor: float | None = None) -> RopeScaling:
    """YaRN (NTK-by-parts) RoPE scaling of ``dims`` rotated features: pair i
    keeps its period ``theta ** (2i / dims)`` where it turns more than
    ``beta_fast`` times over the ``original_context``, is stretched
    ``factor`` times where it turns fewer than ``beta_slow`` times, and is
    blended linearly (in frequency) between; the two bounding pairs are
    rounded outward with ``truncate`` (Hugging Face's default and
    llama.cpp's; gpt-oss's config turns it off). ``attention_factor``
    defaults to :func:`yarn_attention_factor`."""
    def pair_turning(rotations: float) -> float:
        # The pair index whose wavelength fits `rotations` times in the context.
        turns = original_context / (rotations * 2 * math.pi)
        return dims * math.log(turns) / (2 * math.log(theta))

    low, high = pair_turning(beta_fast), pair_turning(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if high == low:
        high += 0.001  # a step rather than a division by zero
    periods = []
    for i in range(dims // 2):
        period = theta ** (2 * i / dims)
        kept = 1.0 - min(max((i - low) / (high - low), 0.0), 1.0)
        periods.append(1.0 / (kept / period + (1.0 - kept) / (factor * period)))
    return RopeScaling(1.0, tuple(periods), yarn_attention_factor(factor)
                       if attention_factor is None else attention_factor)


def _scaling_number(scaling: dict[str, Any], key: str, default: float | None) -> float:
    """Field ``key`` of ``config.json``'s rope_scaling, a positive number."""
    value = scaling.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ModelError(f"config.json: rope_scaling {key} must be a positive number, got "
                         f"{value!r}")
    return float(value)


def rope_scaling_from_hf(hf: HFConfig, theta: float, head_dim: int,
                         allowed: Sequence[str] = ("default", "linear", "llama3")
                         ) -> RopeScaling:
    """The :class:`RopeScaling` of ``config.json``'s RoPE scaling
    (:meth:`~.base.HFConfig.rope_scaling`): none or ``default``;
    ``linear`` (positions times ``1 / factor``); ``llama3`` (long wavelengths
    stretched by ``factor``, short ones kept, a smooth blend between);
    ``yarn`` (:func:`yarn`, with Hugging Face's keys and defaults:
    ``beta_fast`` 32, ``beta_slow`` 1, ``truncate`` true,
    ``original_max_position_embeddings`` the config's context, and the
    attention factor ``attention_factor``, else from ``mscale`` and
    ``mscale_all_dim`` where both are set). A type not in ``allowed`` is a
    :class:`ModelError` naming it."""
    scaling = hf.rope_scaling()
    if not scaling:
        return RopeScaling()
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in allowed:
        raise ModelError(f"config.json: rope_scaling type {kind!r} is not supported by the "
                         f"{hf.model_type} family (supported: {', '.join(allowed)})")
    if kind == "default":
        return RopeScaling()
    factor = _scaling_number(scaling, "factor", 1.0)
    if kind == "linear":
        return RopeScaling(scale=1.0 / factor)
    if kind == "yarn":
        attention_factor = scaling.get("attention_factor")
        if attention_factor is not None:
            attention_factor = _scaling_number(scaling, "attention_factor", None)
        elif scaling.get("mscale") and scaling.get("mscale_all_dim"):
            attention_factor = (
                yarn_attention_factor(factor, _scaling_number(scaling, "mscale", None))
                / yarn_attention_factor(factor, _scaling_number(scaling, "mscale_all_dim", None)))
        truncate = scaling.get("truncate", True)
        if not isinstance(truncate, bool):
            raise ModelError(f"config.json: rope_scaling truncate must be true or false, got "
                             f"{truncate!r}")
        return yarn(theta, head_dim, factor,
                    _scaling_number(scaling, "original_max_position_embeddings",
                                    hf.integer("max_position_embeddings")),
                    _scaling_number(scaling, "beta_fast", 32.0),
                    _scaling_number(scaling, "beta_slow", 1.0), truncate, attention_factor)
    original = float(scaling.get("original_max_position_embeddings", 8192))
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    periods = []
    for i in range(0, head_dim, 2):
        period = theta ** (i / head_dim)
        wavelength = 2 * math.pi * period
        if wavelength > original / low:
            period *= factor
        elif wavelength > original / high:
            smooth = (original / wavelength - low) / (high - low)
            period /= (1 - smooth) / factor + smooth
        periods.append(period)
    return RopeScaling(freqs=tuple(periods))


def reject_sliding_window(hf: HFConfig, context: int) -> None:
    """A family without sliding-window attention refuses a sliding window
    shorter than the context it would run (Mistral v0.1 declares one; later
    Mistral and Qwen2 leave it off or at the context)."""
    sliding_window = (hf.integer("sliding_window", None) if hf.get("use_sliding_window", True)
                      else None)
    if sliding_window is not None and sliding_window < context:
        raise ModelError(f"config.json: sliding_window {sliding_window} (< "
                         f"max_position_embeddings {context}) is not supported by the "
                         f"{hf.model_type} family")


class LlamaFamily(Family):
    """Llama, Mistral and Qwen2 (see the module docstring)."""

    name = "llama"
    hf_model_types = ("llama", "mistral", "qwen2")
    gguf_architectures = ("llama", "qwen2")
    gguf_setting_tensors = ("rope_freqs.weight",)

    def reads_gguf(self, architecture: str, metadata: Mapping[str, Any]) -> bool:
        """Llama and Qwen2 GGUF files without experts (llama.cpp writes
        Mixtral as ``llama`` with ``llama.expert_count``: the mixtral
        family's)."""
        return (architecture in self.gguf_architectures
                and not gguf_expert_count(architecture, metadata))

    def config_from_hf(self, hf: HFConfig) -> ModelConfig:
        """Llama/Mistral/Qwen2 ``config.json``: SiLU only, no MLP biases, no
        sliding window shorter than the context; RoPE scaling linear or llama3."""
        hf.choice("hidden_act", ("silu",), "silu")
        hf.reject("mlp_bias", "MLP biases")
        fields = hf.common()
        reject_sliding_window(hf, fields["context_length"])
        rope = rope_scaling_from_hf(hf, fields["rope_theta"], fields["head_dim"])
        return ModelConfig(**fields, family=self.name, rope_scale=rope.scale,
                           rope_freqs=rope.freqs,
                           attention_bias=(hf.model_type == "qwen2"
                                           or bool(hf.get("attention_bias", False))))

    def config_from_gguf(self, gguf: GGUFMetadata) -> ModelConfig:
        """Llama/Qwen2 GGUF metadata; a ``rope_freqs`` tensor (llama3
        scaling: per-pair divisors of the frequencies) becomes ``rope_freqs``."""
        fields = gguf.common()
        head_dim = fields["head_dim"]
        gguf.require_full_rope(head_dim, "llama")
        rope_freqs = None
        factors = gguf.setting_tensors.get("rope_freqs.weight")
        if factors is not None:
            periods = fields["rope_theta"] ** (mx.arange(0, head_dim, 2, dtype=mx.float32)
                                               / head_dim)
            rope_freqs = tuple((periods * factors.astype(mx.float32)).tolist())
        return ModelConfig(
            **fields, family=self.name,
            # llama.cpp's converter permutes Llama's Q/K rows into the
            # interleaved layout; Qwen2's keep the half-split one (NEOX).
            rope_traditional=gguf.architecture == "llama",
            rope_scale=gguf.linear_rope_scale(), rope_freqs=rope_freqs,
            attention_bias="blk.0.attn_q.bias" in gguf.tensor_names)

    def weights(self, config: ModelConfig) -> tuple[Weight, ...]:
        """The llama layout (:func:`decoder_weights`)."""
        return decoder_weights()


class LlamaDecoder(Decoder):
    """The llama forward pass. Where a layer's q/k/v and gate/up
    projections are fused (:class:`~mlxprog.llm.spec.ModelSpec`), one
    matmul each; with the projections quantized alike and no biases on one
    rank, the whole layer is one ``transformer_layer`` op. Each residual add
    is done with the norm after it (``fast_add_rms_norm``)."""

    #: Whether the fused attention block and whole-layer op may be used
    #: (families whose attention does more than RoPE, and the per-head norms
    #: of :meth:`head_norms`, between the projection and the cache turn it
    #: off).
    fused_attention = True

    def head_norms(self, sb, i: int) -> tuple[list[Value], dict[str, Any]]:
        """Layer ``i``'s per-head q/k norms for the attention-block and
        whole-layer ops: their operands and attributes (none here; Qwen3's
        decoder has them, and its :meth:`qkv` applies them where
        ``fused_attention`` is off)."""
        return [], {}

    def rope_settings(self, i: int) -> dict[str, Any]:
        """Layer ``i``'s RoPE settings for :meth:`~Decoder.rope`."""
        return {}

    def attention_settings(self, i: int) -> dict[str, Any]:
        """Layer ``i``'s attention settings for :meth:`~Decoder.attend`."""
        return {}

    def qkv(self, sb, i: int, x: Value, T, rope_offset) -> tuple[Value, Value, Value]:
        """Layer ``i``'s queries, keys and values of the normed ``x``, in the
        ``[B, heads, T, D]`` layout, q and k rotated. With the fused
        projection, one matmul, one RoPE over the q and k heads together,
        and two splits."""
        p = f"layers.{i}.self_attn"
        heads, kv_heads = self.shard.num_heads, self.shard.num_kv_heads
        rope = self.rope_settings(i)
        if f"{p}.qkv_proj" in self.spec.fused:
            y = self.heads(sb, self.linear(sb, f"{p}.qkv_proj", x), heads + 2 * kv_heads, T)
            qk, v = sb.split(y, indices_or_sections=[heads + kv_heads], axis=1)
            q, k = sb.split(self.rope(sb, qk, rope_offset, **rope),
                            indices_or_sections=[heads], axis=1)
            return q, k, v
        q = self.rope(sb, self.heads(sb, self.linear(sb, f"{p}.q_proj", x), heads, T),
                      rope_offset, **rope)
        k = self.rope(sb, self.heads(sb, self.linear(sb, f"{p}.k_proj", x), kv_heads, T),
                      rope_offset, **rope)
        v = self.heads(sb, self.linear(sb, f"{p}.v_proj", x), kv_heads, T)
        return q, k, v

    def attention(self, sb, i: int, x: Value, T, rope_offset, cache_offset, key_mask,
                  cache: LayerCache) -> tuple[Value, LayerCache]:
        """Layer ``i``'s attention of the normed ``x`` (before the output
        projection) over its ``cache``: [B, T, heads * D] and the new
        cache."""
        p = f"layers.{i}.self_attn"
        if self.fused_attention:
            # Separate q/k/v projections (parts of other quantizations) are
            # joined for the block: one concatenation costs less than the
            # nodes of the unfused attention.
            qkv = (self.linear(sb, f"{p}.qkv_proj", x) if f"{p}.qkv_proj" in self.spec.fused
                   else sb.concatenate(*(self.linear(sb, f"{p}.{n}_proj", x) for n in "qkv"),
                                       axis=-1))
            return self.attention_block(sb, i, qkv, rope_offset, cache_offset, key_mask, cache)
        q, k, v = self.qkv(sb, i, x, T, rope_offset)
        return self.attend(sb, q, k, v, T, cache_offset, key_mask, cache,
                           **self.attention_settings(i))

    def rope_attributes(self) -> dict[str, Any]:
        """The RoPE attributes of the attention-block and whole-layer ops."""
        c = self.c
        return dict(rope_dims=c.head_dim, traditional=c.rope_traditional, base=c.rope_theta,
                    rope_scale=c.rope_scale, freqs=c.rope_freqs is not None)

    def rope_freqs_operand(self, sb) -> list[Value]:
        """The freqs operand of the attention-block and whole-layer ops, if any."""
        c = self.c
        return [sb.constant(list(c.rope_freqs), "float32")] if c.rope_freqs is not None else []

    def attention_block(self, sb, i: int, qkv: Value, rope_offset, cache_offset, key_mask,
                        cache: LayerCache) -> tuple[Value, LayerCache]:
        """Layer ``i``'s attention from the fused projection's output ``qkv``
        [B, T, (heads + 2 kv_heads) D]: one ``kv_cache_attention_block``
        (heads, their norms, RoPE, cache writes and attention in one node on
        the CPU) giving [B, T, heads * D] and the new cache."""
        norms, norm_attributes = self.head_norms(sb, i)
        attn, *new = sb.kv_cache_attention_block(
            qkv, *cache, cache_offset, rope_offset, *self.rope_freqs_operand(sb), *norms,
            key_mask, heads=self.shard.num_heads,
            kv_heads=self.shard.num_kv_heads, **self.rope_attributes(),
            **self.kv.block_attributes(), **norm_attributes)
        return attn, tuple(new)

    def mlp(self, sb, i: int, x: Value) -> Value:
        """Layer ``i``'s SwiGLU MLP of the normed ``x`` (before the ranks'
        partial sums are added: the down projection reduces); with the fused
        gate/up projection, one matmul whose halves go to one SwiGLU."""
        p = f"layers.{i}.mlp"
        if f"{p}.gate_up_proj" in self.spec.fused:
            gate_rows = self.spec.local_shape(f"{p}.gate_proj.weight", self.shard)[0]
            fused = self.linear(sb, f"{p}.gate_up_proj", x)
            if 2 * gate_rows == self.spec.local_shape(f"{p}.gate_up_proj.weight",
                                                      self.shard)[0]:
                # Gate and up are the halves: one SwiGLU node, no split.
                return self.linear(sb, f"{p}.down_proj", sb.fast_swiglu(fused), reduce=True)
            gate, up = sb.split(fused, indices_or_sections=[gate_rows], axis=-1)
        else:
            gate = self.linear(sb, f"{p}.gate_proj", x)
            up = self.linear(sb, f"{p}.up_proj", x)
        return self.linear(sb, f"{p}.down_proj", sb.fast_swiglu(gate, up), reduce=True)

    def add_norm(self, sb, name: str, h: Value, y: Value) -> tuple[Value, Value]:
        """The residual ``h + y`` and its norm by weight ``name``, in one op
        (one graph node on the CPU)."""
        weight = sb.astype(self.weight(name), dtype="float32")
        return sb.fast_add_rms_norm(h, y, weight, eps=self.c.norm_eps)

    def layer(self, sb, i: int, h: Value, x: Value, T, rope_offset, cache_offset, key_mask,
              cache: LayerCache) -> tuple[Value, Value, LayerCache]:
        """Transformer layer ``i`` on the hidden states ``h`` [B, T, hidden]
        and ``x``, their norm by the layer's input norm: ``h`` plus the
        attention, the MLP's output (left for the caller to add with the
        next norm, see :meth:`trunk`) and the layer's new cache."""
        p = f"layers.{i}"
        attn, cache = self.attention(sb, i, x, T, rope_offset, cache_offset, key_mask, cache)
        h, x = self.add_norm(sb, f"{p}.post_attention_layernorm.weight", h,
                             self.linear(sb, f"{p}.self_attn.o_proj", attn, reduce=True))
        return h, self.mlp(sb, i, x), cache

    def whole_layer(self, i: int) -> Quantization | tuple[tuple[str, ...], ...] | None:
        """How layer ``i`` can be one ``transformer_layer`` op, or None: the
        projections' one MLX quantization (fused q/k/v and gate/up halves)
        or, with every projection in GGUF blocks, the layer's weights by
        part (:meth:`ggml_parts`); either way no projection biases and one
        rank."""
        p = f"layers.{i}"
        names = [f"{p}.self_attn.qkv_proj", f"{p}.self_attn.o_proj", f"{p}.mlp.gate_up_proj",
                 f"{p}.mlp.down_proj"]
        parts = [f"{p}.self_attn.{n}_proj" for n in "qkvo"] + [
            f"{p}.mlp.{n}_proj" for n in ("gate", "up", "down")]
        if (not self.fused_attention or self.shard.world_size > 1
                or any(self.has(f"{name}.bias") for name in names + parts)):
            return None
        if all(isinstance(self.spec.quantization.get(name), GGMLQuantization) for name in parts):
            return tuple(tuple(name for name, _ in group) for group in self.ggml_parts(i))
        quant = {self.spec.quantization.get(name) for name in names}
        # The affine form's op reads one MLX affine quantization for all four.
        if (len(quant) != 1 or not isinstance(next(iter(quant)), Quantization)
                or next(iter(quant)).mode != "affine"
                or any(name not in self.spec.fused for name in names[::2])):
            return None
        gate_rows = self.spec.local_shape(f"{p}.mlp.gate_proj.weight", self.shard)[0]
        if 2 * gate_rows != self.spec.local_shape(f"{p}.mlp.gate_up_proj.weight", self.shard)[0]:
            return None
        return quant.pop()

    def ggml_parts(self, i: int) -> list[list[tuple[str, str]]]:
        """Layer ``i``'s qkv, o, gate_up and down projections as the
        ``transformer_layer`` op's GGML parts: (layer, GGML type) of each,
        a fused projection as one part (its parts share the type)."""
        p = f"layers.{i}"
        groups = [("self_attn.qkv_proj", ("q", "k", "v"), "self_attn"),
                  ("self_attn.o_proj", ("o",), "self_attn"),
                  ("mlp.gate_up_proj", ("gate", "up"), "mlp"),
                  ("mlp.down_proj", ("down",), "mlp")]
        out = []
        for fused, members, module in groups:
            layers = ([f"{p}.{fused}"] if f"{p}.{fused}" in self.spec.fused
                      else [f"{p}.{module}.{m}_proj" for m in members])
            out.append([(layer, self.spec.quantization[layer].type) for layer in layers])
        return out

    def transformer_layer(self, sb, i: int, quant, h: Value, rope_offset,
                          cache_offset, key_mask, cache: LayerCache
                          ) -> tuple[Value, LayerCache]:
        """Layer ``i`` as one ``transformer_layer`` op (see
        :meth:`whole_layer`, whose result ``quant`` is): the layer's hidden
        states and new cache."""
        p = f"layers.{i}"
        if isinstance(quant, Quantization):
            projections = [self.weight(f"{p}.{name}.{part}")
                           for name in ("self_attn.qkv_proj", "self_attn.o_proj",
                                        "mlp.gate_up_proj", "mlp.down_proj")
                           for part in ("weight", "scales", "biases")]
            attention, mlp = projections[:6], projections[6:]
            packing = dict(group_size=quant.group_size, bits=quant.bits)
            numerics = self.numerics
        else:
            groups = [[self.weight(f"{layer}.weight") for layer, _ in group]
                      for group in self.ggml_parts(i)]
            attention, mlp = groups[0] + groups[1], groups[2] + groups[3]
            packing = dict(ggml_parts=[[t for _, t in group] for group in self.ggml_parts(i)])
            numerics = self.ggml_numerics(f"{p}.self_attn.o_proj")
        norms, norm_attributes = self.head_norms(sb, i)
        h, *new = sb.transformer_layer(
            h, self.weight(f"{p}.input_layernorm.weight"), *attention,
            self.weight(f"{p}.post_attention_layernorm.weight"), *mlp,
            *cache, cache_offset, rope_offset,
            *self.rope_freqs_operand(sb), *norms, key_mask, heads=self.shard.num_heads,
            kv_heads=self.shard.num_kv_heads, **self.rope_attributes(), eps=self.c.norm_eps,
            **packing, **self.kv.block_attributes(), **norm_attributes,
            **self._numerics(numerics))
        return h, tuple(new)

    def trunk(self, sb, h: Value, T, rope_offset, cache_offset, key_mask,
              caches: Sequence[LayerCache]) -> tuple[Value, tuple[LayerCache, ...]]:
        """Every layer on the embedded tokens ``h`` [B, T, hidden], each over
        its cache, then the final norm: the normed hidden states and each
        layer's new cache (see :meth:`Decoder.trunk`). A layer is
        one ``transformer_layer`` op where it can be (:meth:`whole_layer`);
        between the others each residual add is done with the norm after it
        (:meth:`add_norm`: a layer's MLP output is added there)."""
        pending: Value | None = None  # the last layer's MLP output, not yet added to h

        def normed(name: str) -> Value:
            nonlocal h, pending
            if pending is None:
                return self.norm(sb, name, h)
            h, x = self.add_norm(sb, name, h, pending)
            pending = None
            return x

        new_caches: list[LayerCache] = []
        for i, cache in enumerate(caches):
            quant = self.whole_layer(i)
            if quant is not None:
                if pending is not None:
                    h, pending = sb.add(h, pending), None
                h, cache = self.transformer_layer(sb, i, quant, h, rope_offset, cache_offset,
                                                  key_mask, cache)
            else:
                x = normed(f"layers.{i}.input_layernorm.weight")
                h, pending, cache = self.layer(sb, i, h, x, T, rope_offset, cache_offset,
                                               key_mask, cache)
            new_caches.append(cache)
        return normed("norm.weight"), tuple(new_caches)


LlamaFamily.decoder = LlamaDecoder
FAMILY = LlamaFamily()
