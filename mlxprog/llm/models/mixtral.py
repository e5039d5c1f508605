"""The mixtral family: Mixtral 8x7B and 8x22B.

The llama decoder (Mistral's attention) with a mixture of experts for the
MLP (``block_sparse_moe``): the router's ``num_experts_per_tok`` largest
logits kept and a softmax taken over them alone; each of the
``num_local_experts`` experts a SwiGLU of width ``intermediate_size``
(Hugging Face's ``w1`` gate, ``w3`` up, ``w2`` down). llama.cpp writes
Mixtral as architecture ``llama`` with ``llama.expert_count`` (its Q/K rows
permuted into the interleaved RoPE layout, as for Llama): this family
reads those files, the llama family the ones without experts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..config import ModelConfig, MoEConfig
from .base import (Family, GGUFMetadata, HFConfig, Weight, gguf_expert_count,
                   moe_weights)
from .llama import LlamaDecoder, decoder_weights, reject_sliding_window, rope_scaling_from_hf

if TYPE_CHECKING:
    from ...builder import Value

_WEIGHTS = tuple(w for w in decoder_weights() if not w.name.startswith("layers.{i}.mlp.")) + \
    moe_weights("block_sparse_moe", ("w1", "w3", "w2"))


class MixtralFamily(Family):
    """Mixtral (see the module docstring)."""

    name = "mixtral"
    hf_model_types = ("mixtral",)
    gguf_architectures = ("llama",)

    def reads_gguf(self, architecture: str, metadata: Mapping[str, Any]) -> bool:
        """``llama`` GGUF files with experts."""
        return architecture in self.gguf_architectures and bool(
            gguf_expert_count(architecture, metadata))

    def config_from_hf(self, hf: HFConfig) -> MoEConfig:
        """Mixtral ``config.json``: SiLU, no sliding window shorter than the
        context, RoPE scaling none or linear; the experts' count and top-k."""
        hf.choice("hidden_act", ("silu",), "silu")
        fields = hf.common()
        reject_sliding_window(hf, fields["context_length"])
        rope = rope_scaling_from_hf(hf, fields["rope_theta"], fields["head_dim"],
                                    allowed=("default", "linear"))
        count, used = hf.experts("num_local_experts")
        return MoEConfig(**fields, family=self.name, rope_scale=rope.scale, rope_freqs=rope.freqs,
                         num_experts=count, experts_per_token=used,
                         expert_intermediate_size=fields["intermediate_size"],
                         router="topk_softmax")

    def config_from_gguf(self, gguf: GGUFMetadata) -> MoEConfig:
        """Mixtral as llama.cpp writes it (``llama`` with experts): the
        interleaved RoPE layout, the experts' count and top-k, their width
        (``expert_feed_forward_length``, else ``feed_forward_length``)."""
        fields = gguf.common()
        gguf.require_full_rope(fields["head_dim"], self.name)
        return MoEConfig(**fields, **gguf.expert_fields(), family=self.name,
                         rope_traditional=True, rope_scale=gguf.linear_rope_scale(),
                         router="topk_softmax")

    def weights(self, config: ModelConfig) -> tuple[Weight, ...]:
        """The llama layout with the experts (:func:`~.base.moe_weights`
        under ``block_sparse_moe``) in place of the MLP."""
        return _WEIGHTS


class MixtralDecoder(LlamaDecoder):
    """The llama forward pass with the mixture of experts for the MLP."""

    def whole_layer(self, i: int):
        """None: the whole-layer op has no mixture of experts."""
        return None

    def mlp(self, sb, i: int, x: Value) -> Value:
        """Layer ``i``'s mixture of experts of the normed ``x``."""
        return self.moe(sb, f"layers.{i}.block_sparse_moe", x)


MixtralFamily.decoder = MixtralDecoder
FAMILY = MixtralFamily()
