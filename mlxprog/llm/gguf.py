"""Load GGUF files (llama.cpp's format) with mlxprog's own reader
(:mod:`mlxprog.ggml.gguf_file`), keeping every quantized tensor quantized
(how each GGML type is kept: :mod:`mlxprog.ggml.tensors`).

The ``general.architecture`` picks the family (:mod:`mlxprog.llm.models`),
which parses the metadata and maps llama.cpp's tensor names (``blk.N.attn_q``,
...) to its logical ones through its weight table. Tensors that hold
settings (``rope_freqs``, ...) go into the config.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from .. import native as native_kernels
from ..errors import ModelError
from ..ggml.gguf_file import metadata_value, open_gguf
from ..ggml.tensors import float_tensor, read_tensors
from .checkpoint import Checkpoint
from .models import family_for_gguf
from .models.base import GGUFMetadata, load_checkpoint_tensors
from .tokenizer import Tokenizer


def load_gguf(path: str | Path) -> Checkpoint:
    """Load a GGUF file of a supported family: config, weights (quantized
    ones stay quantized), tokenizer."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model file not found: {path}")
    with open_gguf(path) as gguf:
        try:
            family = family_for_gguf(metadata_value(gguf.metadata.get("general.architecture")),
                                     gguf.metadata)
            tokenizer = Tokenizer.from_gguf_metadata(gguf.metadata)
            settings = {name: float_tensor(gguf, gguf.tensors[name])
                        for name in family.gguf_setting_tensors if name in gguf.tensors}
            names = set(gguf.tensors) - set(settings)
            config = family.config_from_gguf(GGUFMetadata(gguf.metadata, names, tokenizer,
                                                          settings))
        except ModelError as e:
            raise ModelError(f"{path}: {e}") from None
        tensors, block_types = read_tensors(gguf, names, on_gpu=mx.default_device() != mx.cpu,
                                            native=native_kernels.default_enabled())
    return load_checkpoint_tensors(family, config, tensors, "gguf", str(path), path, tokenizer,
                                   block_types)
