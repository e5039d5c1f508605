"""A loaded checkpoint: its config, weights, quantization and tokenizer,
as both loaders (:mod:`mlxprog.llm.gguf`, :mod:`mlxprog.llm.hf`) produce it.

A :class:`Checkpoint` holds a :class:`~mlxprog.llm.config.ModelConfig` (a
family's subclass where it has settings of its own), a flat dict of weights
under the family's logical names (see :mod:`mlxprog.llm.models.base`), and
the quantization of every quantized layer.

Weight names are Hugging Face's without the ``model.`` prefix
(``layers.0.self_attn.q_proj.weight``); shapes are the logical ``(out, in)``
ones. A quantized layer (embedding or projection) keeps MLX's quantized
form: ``.weight`` is the packed ``uint32`` array of shape ``(out, in * bits /
32)``, with ``.scales`` and ``.biases`` of shape ``(out, in / group_size)``;
``Checkpoint.quantization`` maps the layer name (the weight name without
``.weight``) to its bits and group size. A layer of a GGUF file whose GGML
type MLX's format cannot hold keeps the file's own blocks: ``.weight`` is
``uint8 (out, row_bytes)``, and its quantization a
:class:`GGMLQuantization` naming the type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx

from ..errors import ModelError
from ..ggml import types as ggml_types
from .config import ModelConfig
from .tokenizer import Tokenizer

_QUANT_BITS = (2, 3, 4, 5, 6, 8)
_QUANT_GROUP_SIZES = (32, 64, 128)


@dataclass(frozen=True)
class Quantization:
    """How one MLX-quantized layer is packed: ``mode`` ``"affine"`` (a scale
    and a bias per group) or ``"mxfp4"`` (an E8M0 scale byte per group of 32
    e2m1 values, no biases: gpt-oss's experts)."""

    bits: int
    group_size: int
    mode: str = "affine"

    @property
    def parts(self) -> tuple[str, ...]:
        """The layer's stored arrays besides ``.bias``."""
        return ("weight", "scales", "biases") if self.mode == "affine" else ("weight", "scales")

    def stored_columns(self, part: str, start: int, end: int) -> tuple[int, int]:
        """The columns of stored array ``part`` (``weight``, ``scales``,
        ``biases``) that hold logical columns [start, end) (whole groups)."""
        if part == "weight":
            return start * self.bits // 32, end * self.bits // 32
        return start // self.group_size, end // self.group_size


@dataclass(frozen=True)
class GGMLQuantization:
    """A layer kept in a GGUF file's own blocks of GGML type ``type`` (a
    block type of :mod:`mlxprog.ggml.types`): its ``.weight`` is ``uint8
    (out, row_bytes)``, read by the ``ggml_matmul`` / ``ggml_dequantize``
    ops."""

    type: str

    @property
    def group_size(self) -> int:
        """The elements of a block: the columns a split keeps together."""
        return ggml_types.BY_NAME[self.type].block

    def stored_columns(self, part: str, start: int, end: int) -> tuple[int, int]:
        """The byte columns of the weight that hold logical columns
        [start, end) (whole blocks)."""
        t = ggml_types.BY_NAME[self.type]
        return t.row_bytes(start), t.row_bytes(end)


@dataclass
class Checkpoint:
    """A loaded model: config, weights (see the module docstring for names),
    quantization per quantized layer, tokenizer, and where each weight came from.

    ``source_names`` maps every weight name to the tensor name in the file, so a
    program can bind captures straight from the model file. ``adapter_path``
    is the LoRA adapter fused into the weights (None: none; see
    :mod:`mlxprog.llm.adapters`).
    """

    path: Path
    config: ModelConfig
    weights: dict[str, mx.array]
    quantization: dict[str, Quantization | GGMLQuantization]
    tokenizer: Tokenizer
    source_names: dict[str, str] = field(default_factory=dict)
    adapter_path: Path | None = None


def infer_quantization(name: str, packed: mx.array, scales: mx.array, biases: mx.array | None,
                       shape: tuple[int, ...]) -> Quantization:
    """Bits, group size and mode of quantized layer ``name`` whose logical
    shape is ``shape`` = (out, in), or (experts, out, in) for stacked
    experts, from the packed weight and scales shapes: affine with
    ``biases``, mxfp4 (uint8 scales, groups of 32 4-bit values) without."""
    *rows, in_features = shape
    if packed.dtype != mx.uint32:
        raise ModelError(f"{name}: quantized weight must be uint32, got {packed.dtype}")
    if (packed.ndim != len(shape) or scales.ndim != len(shape)
            or list(packed.shape[:-1]) != rows or list(scales.shape[:-1]) != rows
            or (biases is not None and biases.shape != scales.shape)):
        parts = f"weight {tuple(packed.shape)}, scales {tuple(scales.shape)}" + (
            "" if biases is None else f", biases {tuple(biases.shape)}")
        raise ModelError(f"{name}: quantized shapes {parts} do not fit the layer shape "
                         f"{tuple(shape)}")
    bits, bits_rem = divmod(packed.shape[-1] * 32, in_features)
    group_size, group_rem = divmod(in_features, scales.shape[-1])
    if biases is None:
        if scales.dtype != mx.uint8 or (bits, group_size) != (4, 32) or bits_rem or group_rem:
            raise ModelError(f"{name}: packed weight {tuple(packed.shape)} with {scales.dtype} "
                             f"scales {tuple(scales.shape)} and no biases is not an MLX mxfp4 "
                             f"quantization of a {tuple(shape)} matrix (uint8 scales, groups "
                             "of 32 4-bit values)")
        return Quantization(bits=4, group_size=32, mode="mxfp4")
    if bits_rem or group_rem or bits not in _QUANT_BITS or group_size not in _QUANT_GROUP_SIZES:
        raise ModelError(f"{name}: packed weight {tuple(packed.shape)} with scales "
                         f"{tuple(scales.shape)} is not an MLX quantization of a "
                         f"{tuple(shape)} matrix")
    return Quantization(bits=bits, group_size=group_size)
