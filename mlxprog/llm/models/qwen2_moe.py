"""The qwen2_moe family: Qwen1.5-MoE and Qwen2-MoE (Qwen2-57B-A14B).

Qwen2's decoder (q/k/v biases, no q/k norms) with a mixture of experts for
the MLP as Qwen3-MoE's (:mod:`.qwen3_moe`: softmax over every expert, the
``num_experts_per_tok`` best kept, renormalized only with
``norm_topk_prob``), plus a shared expert every token runs: a SwiGLU of
width ``shared_expert_intermediate_size`` whose output is scaled by
``sigmoid(shared_expert_gate(x))`` (one logit per token) and added to the
experts'. llama.cpp's ``qwen2moe`` files name it ``ffn_*_shexp`` and its
gate ``ffn_gate_inp_shexp``, and never renormalize the kept weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import ModelConfig, MoEConfig
from .base import Family, GGUFMetadata, HFConfig, Weight, moe_weights
from .llama import LlamaDecoder
from .qwen3 import qwen_hf_fields
from .qwen3_moe import dense_mlp_weights, qwen_expert_fields

if TYPE_CHECKING:
    from ...builder import Value


def _shared_expert() -> tuple[Weight, ...]:
    """The shared expert's SwiGLU and its gate, in every layer with experts."""
    layer = "layers.{i}.mlp"
    shapes = {"gate_proj": lambda c: (c.shared_expert_intermediate_size, c.hidden_size),
              "up_proj": lambda c: (c.shared_expert_intermediate_size, c.hidden_size),
              "down_proj": lambda c: (c.hidden_size, c.shared_expert_intermediate_size)}
    return tuple(
        Weight(f"{layer}.shared_expert.{name}", shapes[name],
               hf=f"model.{layer}.shared_expert.{name}",
               gguf=f"blk.{{i}}.ffn_{name[:-len('_proj')]}_shexp", layers=MoEConfig.expert_layers)
        for name in shapes) + (
        Weight(f"{layer}.shared_expert_gate", lambda c: (1, c.hidden_size),
               hf=f"model.{layer}.shared_expert_gate", gguf="blk.{i}.ffn_gate_inp_shexp",
               layers=MoEConfig.expert_layers),)


_WEIGHTS = dense_mlp_weights() + moe_weights() + _shared_expert()


class Qwen2MoeFamily(Family):
    """Qwen2-MoE (see the module docstring)."""

    name = "qwen2_moe"
    hf_model_types = ("qwen2_moe",)
    gguf_architectures = ("qwen2moe",)

    def config_from_hf(self, hf: HFConfig) -> MoEConfig:
        """Qwen2-MoE ``config.json``: Qwen2's attention (q/k/v biases), the
        experts, the shared expert's width, the dense layers."""
        fields = qwen_hf_fields(hf)
        return MoEConfig(**fields, **qwen_expert_fields(hf, fields["num_layers"]),
                         family=self.name, attention_bias=True,
                         shared_expert_intermediate_size=hf.integer(
                             "shared_expert_intermediate_size"))

    def config_from_gguf(self, gguf: GGUFMetadata) -> MoEConfig:
        """Qwen2-MoE GGUF metadata: half-split RoPE, the experts' count,
        top-k and width, the shared expert's width; the kept weights not
        renormalized (llama.cpp's, unless ``expert_weights_norm`` says so)."""
        fields = gguf.common()
        gguf.require_full_rope(fields["head_dim"], self.name)
        return MoEConfig(**fields, **gguf.expert_fields(), family=self.name,
                         rope_traditional=False, rope_scale=gguf.linear_rope_scale(),
                         attention_bias="blk.0.attn_q.bias" in gguf.tensor_names,
                         router="softmax_topk",
                         renormalize=gguf.flag("expert_weights_norm", False),
                         shared_expert_intermediate_size=gguf.integer(
                             "expert_shared_feed_forward_length"))

    def weights(self, config: ModelConfig) -> tuple[Weight, ...]:
        """The llama layout (q/k/v biases) with the experts and the shared
        expert in place of the MLP, which only dense layers keep."""
        return _WEIGHTS


class Qwen2MoeDecoder(LlamaDecoder):
    """Qwen2's forward pass with the mixture of experts and its shared
    expert in the layers that have one."""

    def whole_layer(self, i: int):
        """None: the whole-layer op has no mixture of experts."""
        return None

    def mlp(self, sb, i: int, x: Value) -> Value:
        """Layer ``i``'s MLP of the normed ``x``: the experts
        (:meth:`~.base.Decoder.moe`) plus the shared expert scaled by its
        sigmoid gate, or a dense layer's SwiGLU."""
        if i in self.c.dense_layers:
            return super().mlp(sb, i, x)
        p = f"layers.{i}.mlp"
        shared = self.linear(sb, f"{p}.shared_expert.down_proj", sb.fast_swiglu(
            self.linear(sb, f"{p}.shared_expert.gate_proj", x),
            self.linear(sb, f"{p}.shared_expert.up_proj", x)))
        gate = sb.sigmoid(self.linear(sb, f"{p}.shared_expert_gate", x))
        return self.moe(sb, p, x) + gate * shared


Qwen2MoeFamily.decoder = Qwen2MoeDecoder
FAMILY = Qwen2MoeFamily()
