"""Load Hugging Face checkpoints: a directory with ``config.json``,
``*.safetensors`` and ``tokenizer.json``.

The ``model_type`` picks the family (:mod:`mlxprog.llm.models`), which
parses the config and names the weights it reads; weights keep their
stored dtype, and MLX-quantized checkpoints (``.scales``/``.biases``
tensors) stay quantized.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..errors import ModelError
from ..runtime.binding import weights_file_problem
from .checkpoint import Checkpoint
from .config import ModelConfig
from .models import family_for_model_type, family_of
from .models.base import HFConfig, load_checkpoint_tensors
from .tokenizer import Tokenizer


def load_hf(directory: str | Path) -> Checkpoint:
    """Load a Hugging Face-style checkpoint directory of a supported family."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ModelError(f"{directory}: not a Hugging Face model directory (no config.json)")
    raw = read_json_object(config_path)
    family_for_model_type(raw.get("model_type"))  # an unsupported type fails before the tokenizer
    tokenizer = Tokenizer.from_hf(directory)
    try:
        config = config_from_hf(raw, tokenizer)
    except ModelError as e:
        raise ModelError(f"{directory}: {e}") from None

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{directory}: no *.safetensors weight files")
    tensors: dict[str, mx.array] = {}
    for file in files:
        problem = weights_file_problem(file)
        if problem is not None:
            raise ModelError(f"cannot read safetensors file {file}: {problem}")
        try:
            tensors.update(mx.load(str(file)))
        except (RuntimeError, ValueError) as e:
            raise ModelError(f"cannot read safetensors file {file}: {e}") from e
    return load_checkpoint_tensors(family_of(config), config, tensors, "hf", str(directory),
                                   directory, tokenizer)


def config_from_hf(raw: Mapping[str, Any], tokenizer: Tokenizer | None = None) -> ModelConfig:
    """The config of a parsed ``config.json``, by its family; ``tokenizer``
    supplies BOS/EOS ids the config does not give."""
    family = family_for_model_type(raw.get("model_type"))
    return family.config_from_hf(HFConfig(raw, tokenizer))


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in the file ``path`` (a model's or an adapter's
    config); a :class:`ModelError` naming the file if it cannot be read or
    holds anything but an object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: cannot read JSON: {e}") from None
    if not isinstance(value, dict):
        raise ModelError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value
