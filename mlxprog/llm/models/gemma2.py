"""The gemma2 family: Gemma 2 (and the decoder and config Gemma 3 builds on).

Each layer norms the input, attention and MLP outputs alike:
``h += post_attention_norm(attn(input_norm(h)))`` then
``h += post_feedforward_norm(mlp(pre_feedforward_norm(h)))``, with a GeGLU
MLP (GELU's tanh approximation), grouped-query attention scaled by
``query_pre_attn_scalar ** -0.5`` and its scores soft-capped
(``cap * tanh(s / cap)``), the logits soft-capped too, the embeddings
scaled by ``sqrt(hidden_size)`` and tied to the head. Even layers attend
over a sliding window of ``sliding_window`` tokens, the odd ones over the
whole context (Hugging Face's Gemma 2; mlx-lm's ignores the sliding window).

Every norm scales by ``1 + w``: the Hugging Face weights get the one added
at load (:data:`~.base.PLUS_ONE`, in their stored dtype as mlx-lm adds
it); llama.cpp's converter stores ``w + 1`` already. GGUF files keep
Hugging Face's half-split RoPE layout (NEOX) and name no attention scale:
llama.cpp derives it from the model size (:func:`gguf_query_scale`).

A sliding window is a mask over the full-length cache (``kv_cache_sdpa_update``'s
``window``: a query at slot p sees slots p - window < j <= p), so the cache
layout, prompt caches and batches are those of every family: a row's
tokens sit in consecutive slots, left padding or a cached prefix included,
so a sliding window over slots is the one over its positions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from ...errors import ModelError
from ..config import ModelConfig
from .base import PLUS_ONE, Family, GGUFMetadata, HFConfig, Weight
from .llama import LlamaDecoder, decoder_weights, rope_scaling_from_hf

if TYPE_CHECKING:
    from ...builder import Value
    from ..cache import LayerCache


@dataclass(frozen=True)
class GemmaConfig(ModelConfig):
    """A Gemma 2 or Gemma 3 config: the attention scale, the soft-caps of the
    attention scores and the logits (None: none), the sliding window and
    which layers use it, the RoPE base of those layers (None: the config's
    theta and position scale; set: that base, unscaled) and the dtype
    ``sqrt(hidden_size)`` is rounded to before it scales the embeddings
    (None: the embeddings' own dtype)."""

    query_scale: float = 1.0
    attn_softcap: float | None = None
    final_softcap: float | None = None
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()
    local_rope_theta: float | None = None
    embed_scale_dtype: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_sliding_layers(self)


def positive(value: float | None, field: str) -> float | None:
    """Setting ``field``, which must be positive where it is set (None: off)."""
    if value is not None and not value > 0:
        raise ModelError(f"{field} must be positive, got {value!r}")
    return value


def optional_number(hf: HFConfig, key: str, default: float | None) -> float | None:
    """Numeric field ``key`` where an explicit null turns the feature off
    (Hugging Face's soft-caps) and a missing field means ``default``."""
    if key not in hf.raw:
        return default
    if hf.raw[key] is None:
        return None
    return positive(hf.number(key), f"config.json: {key}")


def hf_gemma_fields(hf: HFConfig) -> dict[str, Any]:
    """What Gemma 2 and 3 ``config.json`` files share: the common fields
    (embeddings tied unless the config says otherwise, as Hugging Face's
    Gemma defaults) and the attention scale; only GELU's tanh
    approximation, no projection biases, causal attention."""
    # Hugging Face's Gemma 2 and 3 read hidden_activation; hidden_act, which
    # many configs also carry, is not theirs.
    hf.choice("hidden_activation", ("gelu_pytorch_tanh",), "gelu_pytorch_tanh")
    hf.reject("attention_bias", "projection biases")
    hf.reject("use_bidirectional_attention", "bidirectional attention")
    # transformers 5 writes RoPE settings there, and may leave rope_theta /
    # rope_scaling out: refused rather than read as their defaults.
    hf.reject("rope_parameters", "give rope_theta and rope_scaling instead")
    fields = hf.common()
    fields["tie_embeddings"] = bool(hf.get("tie_word_embeddings", True))
    scalar = hf.number("query_pre_attn_scalar", 256)
    positive(scalar, "config.json: query_pre_attn_scalar")
    return dict(fields, query_scale=scalar ** -0.5)


def check_sliding_layers(config: ModelConfig) -> None:
    """The ``sliding_layers`` of a config that alternates windowed and full
    attention (Gemma's, gpt-oss's: one flag a layer, whether it attends
    through the ``sliding_window``) fit its layers and its window; else a
    :class:`ModelError`."""
    layers = config.sliding_layers
    if len(layers) != config.num_layers:
        raise ModelError(f"model config: sliding_layers has {len(layers)} entries for "
                         f"{config.num_layers} layers")
    if any(layers) and config.sliding_window is None:
        raise ModelError("model config: sliding layers without a sliding_window")


def hf_sliding_layers(hf: HFConfig, num_layers: int, sliding: Sequence[bool]) -> tuple[bool, ...]:
    """Which layers use the sliding window: ``layer_types`` (newer configs:
    ``"sliding_attention"`` or ``"full_attention"`` per layer), else
    ``sliding``, the family's pattern."""
    kinds = hf.get("layer_types", None)
    if kinds is None:
        return tuple(sliding)
    allowed = ("sliding_attention", "full_attention")
    if not isinstance(kinds, list) or len(kinds) != num_layers or any(k not in allowed
                                                                      for k in kinds):
        raise ModelError(f"config.json: layer_types {kinds!r} is not a list of "
                         f"{num_layers} entries, each {' or '.join(map(repr, allowed))}")
    return tuple(k == "sliding_attention" for k in kinds)


def gguf_query_scale(fields: dict[str, Any], big_layers: int) -> float:
    """llama.cpp's attention scale of a Gemma GGUF (which names none): the
    27B model (``big_layers`` blocks) scales by ``(hidden / heads) ** -0.5``,
    the others by ``head_dim ** -0.5`` (what their query_pre_attn_scalar is)."""
    if fields["num_layers"] == big_layers:
        return (fields["hidden_size"] // fields["num_heads"]) ** -0.5
    return fields["head_dim"] ** -0.5


def gguf_gemma_fields(gguf: GGUFMetadata, family: str) -> dict[str, Any]:
    """What Gemma 2 and 3 GGUF files share: the common fields, full-width
    RoPE in the half-split layout (NEOX), linear scaling at most, and the
    scale of the embeddings by the float32 root, as llama.cpp's."""
    fields = gguf.common()
    gguf.require_full_rope(fields["head_dim"], family)
    return dict(fields, rope_traditional=False,
                rope_scale=gguf.linear_rope_scale(), embed_scale_dtype="float32")


def _norm(name: str, gguf: str) -> Weight:
    """A per-layer ``[hidden]`` norm, ``1 + w`` (the one added to Hugging
    Face's weights; llama.cpp's converter stores it added)."""
    return Weight(f"layers.{{i}}.{name}", lambda c: (c.hidden_size,),
                  hf=f"model.layers.{{i}}.{name}", gguf=f"blk.{{i}}.{gguf}", matrix=False,
                  hf_transform=PLUS_ONE)


#: The llama layout with Gemma's four norms a layer (llama.cpp's names
#: differ from the llama layout's: its ffn_norm is the pre-MLP norm).
WEIGHTS = decoder_weights(
    input_layernorm=_norm("input_layernorm", "attn_norm"),
    post_attention_layernorm=_norm("post_attention_layernorm", "post_attention_norm"),
    norm=Weight("norm", lambda c: (c.hidden_size,), hf="model.norm", gguf="output_norm",
                matrix=False, hf_transform=PLUS_ONE),
) + (_norm("pre_feedforward_layernorm", "ffn_norm"),
     _norm("post_feedforward_layernorm", "post_ffw_norm"))


class Gemma2Family(Family):
    """Gemma 2 (see the module docstring)."""

    name = "gemma2"
    hf_model_types = ("gemma2",)
    gguf_architectures = ("gemma2",)

    def config_from_hf(self, hf: HFConfig) -> GemmaConfig:
        """Gemma 2 ``config.json``; Hugging Face's defaults (soft-caps 50
        and 30, a null one off; sliding window 4096 on even layers); RoPE scaling
        none or linear."""
        fields = hf_gemma_fields(hf)
        n = fields["num_layers"]
        sliding_window = hf.integer("sliding_window", 4096)
        scale = rope_scaling_from_hf(hf, fields["rope_theta"], fields["head_dim"],
                                     allowed=("default", "linear")).scale
        return GemmaConfig(
            **fields, family=self.name, rope_scale=scale,
            attn_softcap=optional_number(hf, "attn_logit_softcapping", 50.0),
            final_softcap=optional_number(hf, "final_logit_softcapping", 30.0),
            sliding_window=positive(sliding_window, "config.json: sliding_window"),
            sliding_layers=hf_sliding_layers(hf, n, [i % 2 == 0 for i in range(n)]))

    def config_from_gguf(self, gguf: GGUFMetadata) -> GemmaConfig:
        """Gemma 2 GGUF metadata, with llama.cpp's defaults (soft-caps 50
        and 30, sliding window 4096 on even layers) and attention scale."""
        fields = gguf_gemma_fields(gguf, self.name)
        sliding_window = gguf.integer("attention.sliding_window", 4096)
        return GemmaConfig(
            **fields, family=self.name, query_scale=gguf_query_scale(fields, big_layers=46),
            attn_softcap=positive(gguf.number("attn_logit_softcapping", 50.0),
                                  "GGUF metadata: gemma2.attn_logit_softcapping"),
            final_softcap=positive(gguf.number("final_logit_softcapping", 30.0),
                                   "GGUF metadata: gemma2.final_logit_softcapping"),
            sliding_window=positive(sliding_window,
                                    "GGUF metadata: gemma2.attention.sliding_window"),
            sliding_layers=tuple(i % 2 == 0 for i in range(fields["num_layers"])))

    def weights(self, config: ModelConfig) -> tuple[Weight, ...]:
        """The llama layout with Gemma's norms (:data:`WEIGHTS`)."""
        return WEIGHTS


class GemmaDecoder(LlamaDecoder):
    """The Gemma 2 forward pass (Gemma 3's too, with its q/k norms): the
    llama decoder's projections and fused residual-add norms, with the
    embedding scale, the post-norms, the GeGLU MLP, the per-layer attention
    settings and the capped logits."""

    # The fused attention block and whole-layer op take no attention scale,
    # soft-cap or sliding window, and have no place for the post-norms.
    fused_attention = False
    c: GemmaConfig

    def embed(self, sb, tokens: Value) -> Value:
        """The embeddings times ``sqrt(hidden_size)``, rounded to
        ``embed_scale_dtype`` or else to the embeddings' own dtype (mlx-lm
        and Hugging Face multiply in it)."""
        dtype = self.c.embed_scale_dtype
        if dtype is None:
            stored = ("embed_tokens.scales" if "embed_tokens" in self.spec.quantization
                      else "embed_tokens.weight")
            dtype = self.spec.weights[stored][1]
        root = mx.array(math.sqrt(self.c.hidden_size), dtype=getattr(mx, dtype))
        return super().embed(sb, tokens) * root.astype(mx.float32).item()

    def rope_settings(self, i: int) -> dict[str, Any]:
        """A sliding layer's own RoPE base, unscaled, where the config has one."""
        c = self.c
        if c.local_rope_theta is None or not c.sliding_layers[i]:
            return {}
        return {"base": c.local_rope_theta, "scale": 1.0}

    def attention_settings(self, i: int) -> dict[str, Any]:
        """The attention scale, the scores' soft-cap and, on a sliding
        layer, the sliding window."""
        c = self.c
        return dict(scale=c.query_scale, softcap=c.attn_softcap,
                    window=c.sliding_window if c.sliding_layers[i] else None)

    def mlp(self, sb, i: int, x: Value) -> Value:
        """Layer ``i``'s GeGLU MLP of the normed ``x`` (before the ranks'
        sum: the down projection reduces); with the fused gate/up
        projection, one matmul whose halves (gate and up hold the same rows
        on every rank) go to one GeGLU."""
        p = f"layers.{i}.mlp"
        if f"{p}.gate_up_proj" in self.spec.fused:
            gated = sb.fast_geglu(self.linear(sb, f"{p}.gate_up_proj", x))
        else:
            gated = sb.fast_geglu(self.linear(sb, f"{p}.gate_proj", x),
                                  self.linear(sb, f"{p}.up_proj", x))
        return self.linear(sb, f"{p}.down_proj", gated, reduce=True)

    def layer(self, sb, i: int, h: Value, x: Value, T, rope_offset, cache_offset, key_mask,
              cache: LayerCache) -> tuple[Value, Value, LayerCache]:
        """Layer ``i`` on ``h`` and its input norm ``x``: ``h`` plus the
        normed attention output, the normed MLP output (left for the caller
        to add with the next norm) and the layer's new cache. mlx-lm's Gemma 3
        clips these residual sums to float16's range in float16; in float32,
        as here, its sums are plain adds."""
        p = f"layers.{i}"
        attn, cache = self.attention(sb, i, x, T, rope_offset, cache_offset, key_mask, cache)
        y = self.norm(sb, f"{p}.post_attention_layernorm.weight",
                      self.linear(sb, f"{p}.self_attn.o_proj", attn, reduce=True))
        h, x = self.add_norm(sb, f"{p}.pre_feedforward_layernorm.weight", h, y)
        out = self.norm(sb, f"{p}.post_feedforward_layernorm.weight", self.mlp(sb, i, x))
        return h, out, cache

    def logits(self, sb, h: Value) -> Value:
        """The head's logits, soft-capped where the config caps them."""
        logits = super().logits(sb, h)
        cap = self.c.final_softcap
        return logits if cap is None else sb.tanh(logits / cap) * cap


Gemma2Family.decoder = GemmaDecoder
FAMILY = Gemma2Family()
