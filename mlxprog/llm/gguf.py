"""Load GGUF files (llama.cpp's format) with ``mx.load``.

MLX reads GGUF's Q4_0, Q4_1 and Q8_0 tensors as MLX-quantized triples
(``name.weight`` packed ``uint32``, ``name.scales``, ``name.biases``), which
are kept as they are; bits and group size are inferred per tensor. The
``general.architecture`` picks the family (:mod:`mlxprog.llm.models`),
which parses the metadata and maps llama.cpp's tensor names
(``blk.N.attn_q``, ...) to its logical ones through its weight table.
Tensors that hold settings (``rope_freqs``, ...) go into the config.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from ..runtime.binding import weights_file_problem
from .config import Checkpoint, ModelError, metadata_value
from .models import family_for_gguf
from .models.base import GGUFMetadata, load_checkpoint_tensors
from .tokenizer import Tokenizer


def load_gguf(path: str | Path) -> Checkpoint:
    """Load a GGUF file of a supported family: config, weights (quantized
    ones stay quantized), tokenizer."""
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
    try:
        family = family_for_gguf(metadata_value(metadata.get("general.architecture")))
        settings = {name: tensors.pop(name) for name in family.gguf_setting_tensors
                    if name in tensors}
        tokenizer = Tokenizer.from_gguf_metadata(metadata)
        config = family.config_from_gguf(GGUFMetadata(metadata, set(tensors), tokenizer,
                                                      settings))
    except ModelError as e:
        raise ModelError(f"{path}: {e}") from None
    return load_checkpoint_tensors(family, config, tensors, "gguf", str(path), path, tokenizer)
