"""Model configuration, checkpoint structure and quantization, shared by
every model family.

Both loaders (:mod:`mlxprog.llm.gguf`, :mod:`mlxprog.llm.hf`) produce a
:class:`Checkpoint`: a :class:`ModelConfig` (a family's subclass where it
has settings of its own), a flat dict of weights under the family's logical
names (see :mod:`mlxprog.llm.models.base`), and the quantization of every
quantized layer.

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

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from ..errors import ModelError
from ..ggml import types as ggml_types

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

_QUANT_BITS = (2, 3, 4, 5, 6, 8)
_QUANT_GROUP_SIZES = (32, 64, 128)


class SettingError(ModelError):
    """A bad value of one of :func:`~mlxprog.llm.load`'s model settings:
    ``setting`` is the parameter's name (``"chat_template"``,
    ``"extra_eos_tokens"``), ``problem`` what is wrong, so that the CLI can
    report it under the flag's name instead."""

    def __init__(self, setting: str, problem: str):
        super().__init__(f"{setting}: {problem}")
        self.setting = setting
        self.problem = problem


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer setting (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


#: The numerics of the quantized matmuls (the ``quantized_matmul`` op's
#: ``numerics``): ``"exact"``, MLX's float numerics (weights dequantized,
#: float products); ``"int8"``, llama.cpp's (activations quantized to 8 bits
#: per weight group, integer dot products).
NUMERICS = ("exact", "int8")
#: The numerics choice that picks by device (see :func:`resolve_numerics`).
AUTO_NUMERICS = "auto"


def resolve_numerics(numerics: str | None, native: bool | None = None) -> str:
    """The quantized matmuls' numerics a choice means: ``"exact"`` or
    ``"int8"`` as given; None or ``"auto"``: ``"int8"`` (llama.cpp's numerics,
    what users of quantized models expect on the CPU) when the default device
    is the CPU and the native kernels are not turned off (``native=False``,
    or ``MLXPROG_NATIVE=0`` with ``native=None``: only the native kernels
    implement it), ``"exact"`` otherwise. Anything else is a
    :class:`ModelError` naming the choices."""
    if numerics is None or numerics == AUTO_NUMERICS:
        from .. import native as native_kernels

        enabled = native_kernels.default_enabled() if native is None else native
        return "int8" if enabled and mx.default_device() == mx.cpu else "exact"
    if numerics not in NUMERICS:
        raise ModelError(f"numerics must be one of {AUTO_NUMERICS!r}, "
                         f"{', '.join(map(repr, NUMERICS))} or None, got {numerics!r}")
    return numerics


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of a decoder: the fields every family has. ``family``
    names the model family (:mod:`mlxprog.llm.models`) whose weight table and
    forward pass the config is for; a family with settings of its own
    (soft-capping, sliding windows, ...) adds them in a subclass.

    The RoPE fields map onto :func:`mlx.core.fast.rope` (see :meth:`rope_kwargs`):
    ``rope_traditional`` is True for GGUF files (llama.cpp's converter permutes
    the Q/K rows into the interleaved layout) and False for Hugging Face
    checkpoints; ``rope_scale`` multiplies positions (linear scaling is
    ``1 / factor``); ``rope_freqs``, when set, holds the per-pair periods that
    replace ``rope_theta ** (2i / head_dim)`` (llama3-style scaling).
    """

    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    norm_eps: float
    rope_theta: float
    rope_traditional: bool
    tie_embeddings: bool
    context_length: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    attention_bias: bool = False
    rope_scale: float = 1.0
    rope_freqs: tuple[float, ...] | None = None
    family: str = "llama"

    def __post_init__(self) -> None:
        sizes = {
            "num_layers": self.num_layers, "hidden_size": self.hidden_size,
            "num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size, "context_length": self.context_length,
        }
        for name, value in sizes.items():
            if not isinstance(value, int) or value <= 0:
                raise ModelError(f"model config: {name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ModelError(f"model config: num_heads ({self.num_heads}) is not a multiple "
                             f"of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ModelError(f"model config: head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_freqs is not None and len(self.rope_freqs) != self.head_dim // 2:
            raise ModelError(f"model config: rope_freqs has {len(self.rope_freqs)} entries, "
                             f"expected head_dim / 2 = {self.head_dim // 2}")

    def rope_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``mx.fast.rope(x, offset=..., **config.rope_kwargs())``."""
        freqs = None if self.rope_freqs is None else mx.array(self.rope_freqs, dtype=mx.float32)
        return {
            "dims": self.head_dim,
            "traditional": self.rope_traditional,
            "base": None if freqs is not None else self.rope_theta,
            "scale": self.rope_scale,
            "freqs": freqs,
        }


@dataclass(frozen=True)
class Quantization:
    """How one MLX-quantized layer is packed."""

    bits: int
    group_size: int

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


def infer_quantization(name: str, packed: mx.array, scales: mx.array, biases: mx.array,
                       shape: tuple[int, int]) -> Quantization:
    """Bits and group size of quantized layer ``name`` whose logical shape is
    ``shape`` = (out, in), from the packed weight and scales shapes."""
    out_features, in_features = shape
    if packed.dtype != mx.uint32:
        raise ModelError(f"{name}: quantized weight must be uint32, got {packed.dtype}")
    if (packed.ndim != 2 or scales.ndim != 2 or packed.shape[0] != out_features
            or scales.shape[0] != out_features or biases.shape != scales.shape):
        raise ModelError(f"{name}: quantized shapes weight {tuple(packed.shape)}, scales "
                         f"{tuple(scales.shape)}, biases {tuple(biases.shape)} do not fit "
                         f"the layer shape {shape}")
    bits, bits_rem = divmod(packed.shape[1] * 32, in_features)
    group_size, group_rem = divmod(in_features, scales.shape[1])
    if bits_rem or group_rem or bits not in _QUANT_BITS or group_size not in _QUANT_GROUP_SIZES:
        raise ModelError(f"{name}: packed weight {tuple(packed.shape)} with scales "
                         f"{tuple(scales.shape)} is not an MLX quantization of a {shape} matrix")
    return Quantization(bits=bits, group_size=group_size)


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


def metadata_value(value: Any) -> Any:
    """A GGUF metadata value as plain Python: ``mx.load`` returns numbers as 0-d
    arrays and numeric lists as 1-d arrays (mlxprog's reader returns plain
    Python already); everything else passes through."""
    if isinstance(value, mx.array):
        return value.item() if value.ndim == 0 else value.tolist()
    return value

