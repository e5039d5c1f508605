"""Load llama-family GGUF files (llama.cpp's format) with ``mx.load``.

MLX reads GGUF's Q4_0, Q4_1 and Q8_0 tensors as MLX-quantized triples
(``name.weight`` packed ``uint32``, ``name.scales``, ``name.biases``), which are
kept as they are; bits and group size are inferred per tensor. Tensor names are
mapped to the scheme documented in :mod:`mlxprog.llm.config`:

=========================  ========================================
GGUF                       mlxprog
=========================  ========================================
``token_embd``             ``embed_tokens``
``blk.N.attn_norm``        ``layers.N.input_layernorm``
``blk.N.attn_q``           ``layers.N.self_attn.q_proj`` (also k, v)
``blk.N.attn_output``      ``layers.N.self_attn.o_proj``
``blk.N.ffn_norm``         ``layers.N.post_attention_layernorm``
``blk.N.ffn_gate``         ``layers.N.mlp.gate_proj`` (also up, down)
``output_norm``            ``norm``
``output``                 ``lm_head`` (absent: tied embeddings)
=========================  ========================================

A ``rope_freqs`` tensor (llama3-style RoPE scaling) goes into the config.
llama.cpp's converter permutes the Q/K projection rows, so GGUF models use the
interleaved (``traditional=True``) RoPE layout.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..runtime.binding import weights_file_problem
from .config import Checkpoint, ModelConfig, ModelError, check_weights, metadata_value
from .tokenizer import Tokenizer

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")

_GLOBAL_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TENSOR_NAME = re.compile(r"(?:blk\.(\d+)\.)?(\w+)\.(weight|bias|scales|biases)")


def weight_name(gguf_name: str) -> str:
    """The mlxprog weight name of GGUF tensor ``gguf_name`` (``blk.3.attn_q.scales``
    -> ``layers.3.self_attn.q_proj.scales``)."""
    match = _TENSOR_NAME.fullmatch(gguf_name)
    table = _BLOCK_NAMES if match and match[1] is not None else _GLOBAL_NAMES
    if match is None or match[2] not in table:
        raise ModelError(f"unknown GGUF tensor {gguf_name!r}")
    stem = table[match[2]]
    if match[1] is not None:
        stem = f"layers.{match[1]}.{stem}"
    return f"{stem}.{match[3]}"


def load_gguf(path: str | Path) -> Checkpoint:
    """Load a llama-family GGUF file: config, weights (quantized ones stay
    quantized), tokenizer."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model file not found: {path}")
    problem = weights_file_problem(path)
    if problem is not None:
        raise ModelError(f"cannot read GGUF file {path}: {problem}")
    try:
        tensors, metadata = mx.load(str(path), return_metadata=True)
    except (RuntimeError, ValueError) as e:
        raise ModelError(f"cannot read GGUF file {path}: {e}") from e

    rope_factors = tensors.pop("rope_freqs.weight", None)
    try:
        tokenizer = Tokenizer.from_gguf_metadata(metadata)
        config = config_from_metadata(metadata, set(tensors), tokenizer, rope_factors)
        source_names = {weight_name(name): name for name in tensors}
    except ModelError as e:
        raise ModelError(f"{path}: {e}") from None
    weights = {name: tensors[source] for name, source in source_names.items()}
    quantization = check_weights(config, weights, str(path))
    return Checkpoint(path=path, config=config, weights=weights, quantization=quantization,
                      tokenizer=tokenizer, source_names=source_names)


def config_from_metadata(metadata: Mapping[str, Any], tensor_names: set[str],
                         tokenizer: Tokenizer,
                         rope_factors: mx.array | None = None) -> ModelConfig:
    """A :class:`ModelConfig` from GGUF metadata. ``tensor_names`` tell whether the
    embeddings are tied (no ``output.weight``) and whether attention has biases;
    ``tokenizer`` gives the BOS/EOS ids; ``rope_factors`` is the optional
    ``rope_freqs`` tensor (per-pair frequency divisors)."""
    arch = metadata_value(metadata.get("general.architecture"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelError(f"GGUF architecture {arch!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

    def get(key: str, default: Any = ModelError) -> Any:
        value = metadata_value(metadata.get(f"{arch}.{key}"))
        if value is None:
            if default is ModelError:
                raise ModelError(f"GGUF metadata lacks {arch}.{key}")
            return default
        return value

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    kv_heads = get("attention.head_count_kv", heads)
    if isinstance(kv_heads, list):
        raise ModelError("per-layer attention.head_count_kv is not supported")
    head_dim = int(get("attention.key_length", hidden // heads))
    if int(get("attention.value_length", head_dim)) != head_dim:
        raise ModelError("attention.value_length differs from key_length: not supported")
    if int(get("rope.dimension_count", head_dim)) != head_dim:
        raise ModelError(f"partial RoPE (rope.dimension_count {get('rope.dimension_count')}"
                         f" of head_dim {head_dim}) is not supported")
    theta = float(get("rope.freq_base", 10000.0))

    linear_factor = get("rope.scale_linear", None)  # older key for linear scaling
    scaling = get("rope.scaling.type", "none" if linear_factor is None else "linear")
    factor = float(get("rope.scaling.factor", linear_factor or 1.0))
    if scaling not in ("none", "linear"):
        raise ModelError(f"RoPE scaling {scaling!r} is not supported (none, linear)")
    rope_freqs = None
    if rope_factors is not None:
        periods = theta ** (mx.arange(0, head_dim, 2, dtype=mx.float32) / head_dim)
        rope_freqs = tuple((periods * rope_factors.astype(mx.float32)).tolist())

    return ModelConfig(
        architecture=arch,
        num_layers=int(get("block_count")),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=head_dim,
        intermediate_size=int(get("feed_forward_length")),
        vocab_size=int(get("vocab_size", tokenizer.vocab_size)),
        norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_theta=theta,
        rope_traditional=True,
        rope_scale=1.0 / factor if scaling == "linear" else 1.0,
        rope_freqs=rope_freqs,
        tie_embeddings="output.weight" not in tensor_names,
        context_length=int(get("context_length")),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_ids=tokenizer.eos_token_ids,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
    )

