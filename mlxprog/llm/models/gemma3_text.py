"""The gemma3_text family: Gemma 3's text decoder.

Gemma 2's decoder (:mod:`.gemma2`) without the attention soft-cap, plus an
RMS norm over each query and key head (``self_attn.q_norm`` / ``k_norm``,
``1 + w`` as the other norms; llama.cpp's converter stores them added
too) between the projection and RoPE. Sliding-window layers are those
where ``(i + 1) % sliding_window_pattern != 0`` (or as ``layer_types``
says) and rotate by their own base (``rope_local_base_freq``), unscaled;
the others by ``rope_theta`` with the config's (linear) scaling. The
embeddings are scaled by ``sqrt(hidden_size)`` rounded to bfloat16, as
mlx-lm's Gemma 3 does in every dtype. The logits are capped only where
``final_logit_softcapping`` is set (Hugging Face's; no released Gemma 3
sets it).

llama.cpp reads a GGUF's sliding window but fixes the rest: every sixth layer
global, the local base 10000, and the attention scale by model size
(:func:`~.gemma2.gguf_query_scale`).
"""

from __future__ import annotations

from ...arrays import is_int
from ...errors import ModelError
from ..config import ModelConfig
from .base import PLUS_ONE, Family, GGUFMetadata, HFConfig, Weight
from .gemma2 import (
    WEIGHTS, GemmaConfig, GemmaDecoder, gguf_gemma_fields, gguf_query_scale, hf_gemma_fields,
    hf_sliding_layers, optional_number, positive,
)
from .llama import rope_scaling_from_hf
from .qwen3 import Qwen3Decoder

#: llama.cpp's fixed Gemma 3 settings for GGUF files.
GGUF_PATTERN = 6
GGUF_LOCAL_ROPE_THETA = 10000.0


def _head_norm(kind: str) -> Weight:
    """The ``1 + w`` norm of each ``kind`` ("q" or "k") head: one
    ``[head_dim]`` weight every head (and every rank) shares."""
    return Weight(f"layers.{{i}}.self_attn.{kind}_norm", lambda c: (c.head_dim,),
                  hf=f"model.layers.{{i}}.self_attn.{kind}_norm",
                  gguf=f"blk.{{i}}.attn_{kind}_norm", matrix=False, hf_transform=PLUS_ONE)


_WEIGHTS = WEIGHTS + (_head_norm("q"), _head_norm("k"))


class Gemma3TextFamily(Family):
    """Gemma 3's text decoder (see the module docstring)."""

    name = "gemma3_text"
    hf_model_types = ("gemma3_text",)
    gguf_architectures = ("gemma3",)

    def config_from_hf(self, hf: HFConfig) -> GemmaConfig:
        """Gemma 3 ``config.json``, with Hugging Face's defaults (global
        theta 1e6, local 1e4, sliding window 4096, pattern 6); RoPE scaling none or
        linear, on the global layers. ``attn_logit_softcapping`` is ignored,
        as Hugging Face's Gemma 3 and mlx-lm's ignore it."""
        fields = hf_gemma_fields(hf)
        fields["rope_theta"] = hf.number("rope_theta", 1e6)
        n = fields["num_layers"]
        pattern = positive(hf.integer("sliding_window_pattern", 6),
                           "config.json: sliding_window_pattern")
        scale = rope_scaling_from_hf(hf, fields["rope_theta"], fields["head_dim"],
                                     allowed=("default", "linear")).scale
        return GemmaConfig(
            **fields, family=self.name, rope_scale=scale,
            final_softcap=optional_number(hf, "final_logit_softcapping", None),
            sliding_window=positive(hf.integer("sliding_window", 4096),
                                    "config.json: sliding_window"),
            sliding_layers=hf_sliding_layers(hf, n, [(i + 1) % pattern != 0 for i in range(n)]),
            local_rope_theta=hf.number("rope_local_base_freq", 10000.0),
            embed_scale_dtype="bfloat16")

    def config_from_gguf(self, gguf: GGUFMetadata) -> GemmaConfig:
        """Gemma 3 GGUF metadata as llama.cpp reads it: no sliding window
        (every layer global) without ``gemma3.attention.sliding_window``; the
        sliding-window layers by ``attention.sliding_window_pattern`` (a
        period n: layer i slides when ``i % n < n - 1``, n 0 all of them; or
        one bool per layer), by default every sixth layer global; the local RoPE base
        ``rope.freq_base_swa``, by default 10000; the logits capped where
        ``gemma3.final_logit_softcapping`` is set."""
        fields = gguf_gemma_fields(gguf, self.name)
        n = fields["num_layers"]
        sliding_window = gguf.integer("attention.sliding_window", 0) or None
        cap = gguf.number("final_logit_softcapping", 0.0) or None
        pattern = gguf.get("attention.sliding_window_pattern", GGUF_PATTERN)
        if isinstance(pattern, list):
            if len(pattern) != n:
                raise ModelError(f"GGUF metadata: gemma3.attention.sliding_window_pattern has "
                                 f"{len(pattern)} entries for {n} layers")
            sliding = [bool(p) for p in pattern]
        elif not is_int(pattern) or pattern < 0:
            raise ModelError(f"GGUF metadata key gemma3.attention.sliding_window_pattern must "
                             f"be a period of at least 0 or a list of layers, got {pattern!r}")
        elif pattern == 0:
            sliding = [True] * n
        else:
            sliding = [i % int(pattern) < int(pattern) - 1 for i in range(n)]
        return GemmaConfig(
            **fields, family=self.name, query_scale=gguf_query_scale(fields, big_layers=62),
            final_softcap=positive(cap, "GGUF metadata: gemma3.final_logit_softcapping"),
            sliding_window=positive(sliding_window,
                                    "GGUF metadata: gemma3.attention.sliding_window"),
            sliding_layers=tuple(sliding_window is not None and s for s in sliding),
            local_rope_theta=positive(gguf.number("rope.freq_base_swa", GGUF_LOCAL_ROPE_THETA),
                                      "GGUF metadata: gemma3.rope.freq_base_swa"))

    def weights(self, config: ModelConfig) -> tuple[Weight, ...]:
        """Gemma 2's table plus the per-head q/k norms."""
        return _WEIGHTS


class Gemma3TextDecoder(GemmaDecoder):
    """Gemma 2's forward pass with q and k normed per head before RoPE."""

    #: Qwen3's: q and k normed over each head, then rotated (by this
    #: decoder's per-layer RoPE settings).
    qkv = Qwen3Decoder.qkv


Gemma3TextFamily.decoder = Gemma3TextDecoder
FAMILY = Gemma3TextFamily()
