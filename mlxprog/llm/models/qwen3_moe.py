"""The qwen3_moe family: Qwen3's mixtures of experts (Qwen3-30B-A3B,
Qwen3-Coder-30B-A3B, ...).

Qwen3's decoder (per-head q/k norms before RoPE, no projection biases)
with a mixture of experts for the MLP (:meth:`~.base.Decoder.moe`): the
router's softmax over every expert, the ``num_experts_per_tok`` best kept
and, with ``norm_topk_prob``, renormalized to sum to one; each expert a
SwiGLU of width ``moe_intermediate_size``. ``decoder_sparse_step`` and
``mlp_only_layers`` make some layers dense (an MLP of ``intermediate_size``)
as Hugging Face's Qwen3-MoE decides it: a layer has experts unless it is
listed in ``mlp_only_layers`` or its index plus one is not a multiple of
``decoder_sparse_step``. llama.cpp's ``qwen3moe`` files have experts in
every layer and always renormalize the kept weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...errors import ModelError
from ..config import ModelConfig, MoEConfig
from .base import Family, GGUFMetadata, HFConfig, Weight, moe_weights
from .llama import decoder_weights
from .qwen3 import Qwen3Decoder, head_norm, qwen_hf_fields

if TYPE_CHECKING:
    from ...builder import Value


def _dense_layers(c: ModelConfig) -> Sequence[int]:
    return c.dense_layers


def dense_mlp_weights() -> tuple[Weight, ...]:
    """The llama layout's entries with the MLP's only in the dense layers
    (:attr:`~.base.MoEConfig.dense_layers`)."""
    return tuple(dataclasses.replace(w, layers=_dense_layers)
                 if w.name.startswith("layers.{i}.mlp.") else w for w in decoder_weights())


def qwen_expert_fields(hf: HFConfig, num_layers: int) -> dict[str, Any]:
    """The :class:`MoEConfig` fields of a Qwen mixture's ``config.json``
    (Qwen2-MoE's, Qwen3-MoE's): the experts' count, top-k and width, a
    softmax over every expert then the k best (renormalized as
    ``norm_topk_prob`` says), the dense layers."""
    count, used = hf.experts()
    return dict(num_experts=count, experts_per_token=used,
                expert_intermediate_size=hf.integer("moe_intermediate_size"),
                router="softmax_topk", renormalize=bool(hf.get("norm_topk_prob", False)),
                dense_layers=dense_layers_from_hf(hf, num_layers))


def dense_layers_from_hf(hf: HFConfig, num_layers: int) -> tuple[int, ...]:
    """The layers a Qwen-MoE ``config.json`` makes dense: those in
    ``mlp_only_layers``, and those whose index plus one is not a multiple of
    ``decoder_sparse_step``."""
    step = hf.integer("decoder_sparse_step", 1)
    if step < 1:
        raise ModelError(f"config.json: decoder_sparse_step must be at least 1, got {step}")
    only = hf.get("mlp_only_layers", [])
    if not isinstance(only, list) or not all(isinstance(i, int) and 0 <= i < num_layers
                                             for i in only):
        raise ModelError(f"config.json: mlp_only_layers {only!r} must list layers of the "
                         f"{num_layers} (num_hidden_layers)")
    return tuple(i for i in range(num_layers) if i in only or (i + 1) % step)


_WEIGHTS = dense_mlp_weights() + (head_norm("q"), head_norm("k")) + moe_weights()


class Qwen3MoeFamily(Family):
    """Qwen3-MoE (see the module docstring)."""

    name = "qwen3_moe"
    hf_model_types = ("qwen3_moe",)
    gguf_architectures = ("qwen3moe",)

    def config_from_hf(self, hf: HFConfig) -> MoEConfig:
        """Qwen3-MoE ``config.json``: Qwen3's attention settings, the
        experts' count, width, top-k and renormalization, the dense layers."""
        hf.reject("attention_bias", "projection biases")
        fields = qwen_hf_fields(hf)
        return MoEConfig(**fields, **qwen_expert_fields(hf, fields["num_layers"]),
                         family=self.name)

    def config_from_gguf(self, gguf: GGUFMetadata) -> MoEConfig:
        """Qwen3-MoE GGUF metadata: Qwen3's (full-width RoPE, half-split
        layout) with the experts' count, top-k and width; the kept weights
        renormalized as llama.cpp does (unless ``expert_weights_norm`` says
        otherwise)."""
        fields = gguf.common()
        gguf.require_full_rope(fields["head_dim"], self.name)
        return MoEConfig(**fields, **gguf.expert_fields(), family=self.name,
                         rope_traditional=False, rope_scale=gguf.linear_rope_scale(),
                         router="softmax_topk",
                         renormalize=gguf.flag("expert_weights_norm", True))

    def weights(self, config: ModelConfig) -> tuple[Weight, ...]:
        """Qwen3's layout with the experts (:func:`~.base.moe_weights`) in
        place of the MLP, which only the dense layers keep."""
        return _WEIGHTS


class Qwen3MoeDecoder(Qwen3Decoder):
    """Qwen3's forward pass with the mixture of experts in the layers that
    have one."""

    def mlp(self, sb, i: int, x: Value) -> Value:
        """Layer ``i``'s MLP of the normed ``x``: the mixture of experts
        (:meth:`~.base.Decoder.moe`), or a dense layer's SwiGLU."""
        if i in self.c.dense_layers:
            return super().mlp(sb, i, x)
        return self.moe(sb, f"layers.{i}.mlp", x)


Qwen3MoeFamily.decoder = Qwen3MoeDecoder
FAMILY = Qwen3MoeFamily()
