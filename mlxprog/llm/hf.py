"""Load llama-family Hugging Face checkpoints: a directory with ``config.json``,
``*.safetensors`` and ``tokenizer.json``.

Weight names lose their ``model.`` prefix (``model.layers.0.self_attn.q_proj.weight``
-> ``layers.0.self_attn.q_proj.weight``, see :mod:`mlxprog.llm.config`). Weights
keep their stored dtype; MLX-quantized checkpoints (``.scales``/``.biases``
tensors) stay quantized. Hugging Face checkpoints use the half-split
(``traditional=False``) RoPE layout.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..runtime.binding import weights_file_problem
from .config import Checkpoint, ModelConfig, ModelError, check_weights
from .tokenizer import Tokenizer

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def load_hf(directory: str | Path) -> Checkpoint:
    """Load a Hugging Face-style llama-family checkpoint directory."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ModelError(f"{directory}: not a Hugging Face model directory (no config.json)")
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelError(f"{config_path}: cannot read JSON: {e}") from e
    tokenizer = Tokenizer.from_hf(directory)
    config = config_from_hf(raw, tokenizer)

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{directory}: no *.safetensors weight files")
    weights: dict[str, mx.array] = {}
    source_names: dict[str, str] = {}
    for file in files:
        problem = weights_file_problem(file)
        if problem is not None:
            raise ModelError(f"cannot read safetensors file {file}: {problem}")
        try:
            tensors = mx.load(str(file))
        except (RuntimeError, ValueError) as e:
            raise ModelError(f"cannot read safetensors file {file}: {e}") from e
        for source, value in tensors.items():
            if source.endswith("rotary_emb.inv_freq"):  # a buffer some checkpoints store
                continue
            name = source.removeprefix("model.")
            weights[name], source_names[name] = value, source
    if config.tie_embeddings:  # some tied checkpoints store the head anyway
        for key in [k for k in weights if k.startswith("lm_head.")]:
            del weights[key], source_names[key]
    quantization = check_weights(config, weights, str(directory))
    return Checkpoint(path=directory, config=config, weights=weights, quantization=quantization,
                      tokenizer=tokenizer, source_names=source_names)


def config_from_hf(raw: Mapping[str, Any], tokenizer: Tokenizer | None = None) -> ModelConfig:
    """A :class:`ModelConfig` from a parsed ``config.json``; ``tokenizer`` supplies
    BOS/EOS ids the config does not give."""
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelError(f"model_type {model_type!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    if "quantization_config" in raw:
        method = raw["quantization_config"].get("quant_method", "?")
        raise ModelError(f"quantized checkpoints ({method}) are not supported")
    if raw.get("hidden_act", "silu") != "silu":
        raise ModelError(f"hidden_act {raw['hidden_act']!r} is not supported (silu)")
    if raw.get("mlp_bias"):
        raise ModelError("MLP biases (mlp_bias) are not supported")

    def get(key: str, default: Any = ModelError) -> Any:
        if raw.get(key) is None:
            if default is ModelError:
                raise ModelError(f"config.json lacks {key!r}")
            return default
        return raw[key]

    context = int(get("max_position_embeddings"))
    window = raw.get("sliding_window") if raw.get("use_sliding_window", True) else None
    if window is not None and window < context:
        raise ModelError(f"sliding-window attention (window {window} < context {context})"
                         " is not supported")

    hidden, heads = int(get("hidden_size")), int(get("num_attention_heads"))
    head_dim = int(get("head_dim", hidden // heads))
    theta = float(get("rope_theta", 10000.0))
    rope_scale, rope_freqs = _rope_scaling(raw.get("rope_scaling"), theta, head_dim)
    eos = get("eos_token_id", None)
    if eos is None:
        eos_ids = tokenizer.eos_token_ids if tokenizer else ()
    else:
        eos_ids = tuple(eos) if isinstance(eos, list) else (eos,)
    return ModelConfig(
        architecture=model_type,
        num_layers=int(get("num_hidden_layers")),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(get("num_key_value_heads", heads)),
        head_dim=head_dim,
        intermediate_size=int(get("intermediate_size")),
        vocab_size=int(get("vocab_size")),
        norm_eps=float(get("rms_norm_eps")),
        rope_theta=theta,
        rope_traditional=False,
        rope_scale=rope_scale,
        rope_freqs=rope_freqs,
        tie_embeddings=bool(get("tie_word_embeddings", False)),
        context_length=context,
        bos_token_id=get("bos_token_id", tokenizer.bos_token_id if tokenizer else None),
        eos_token_ids=eos_ids,
        attention_bias=model_type == "qwen2" or bool(get("attention_bias", False)),
    )


def _rope_scaling(scaling: Mapping[str, Any] | None, theta: float,
                  head_dim: int) -> tuple[float, tuple[float, ...] | None]:
    """(position scale, per-pair periods) for a ``rope_scaling`` entry."""
    if not scaling:
        return 1.0, None
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling.get("factor", 1.0))
    if kind == "default":
        return 1.0, None
    if kind == "linear":
        return 1.0 / factor, None
    if kind != "llama3":
        raise ModelError(f"RoPE scaling {kind!r} is not supported (linear, llama3)")
    # llama3: stretch the long wavelengths by `factor`, keep the short ones,
    # interpolate smoothly between the two cut-offs.
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
    return 1.0, tuple(periods)
