"""Model configuration, checkpoint structure and weight checks for the llama family.

Both loaders (:mod:`mlxprog.llm.gguf`, :mod:`mlxprog.llm.hf`) produce a
:class:`Checkpoint`: a :class:`ModelConfig`, a flat dict of weights under one
naming scheme, and the quantization of every quantized linear layer.

Weight names (Hugging Face names without the ``model.`` prefix)::

    embed_tokens.weight                        (vocab, hidden)
    layers.{i}.input_layernorm.weight          (hidden,)
    layers.{i}.self_attn.q_proj.weight         (heads * head_dim, hidden)   [.bias]
    layers.{i}.self_attn.k_proj.weight         (kv_heads * head_dim, hidden) [.bias]
    layers.{i}.self_attn.v_proj.weight         (kv_heads * head_dim, hidden) [.bias]
    layers.{i}.self_attn.o_proj.weight         (hidden, heads * head_dim)
    layers.{i}.post_attention_layernorm.weight (hidden,)
    layers.{i}.mlp.gate_proj.weight            (intermediate, hidden)
    layers.{i}.mlp.up_proj.weight              (intermediate, hidden)
    layers.{i}.mlp.down_proj.weight            (hidden, intermediate)
    norm.weight                                (hidden,)
    lm_head.weight                             (vocab, hidden), absent when tied

Shapes are the logical ``(out, in)`` shapes. A quantized layer (embedding or
projection) keeps MLX's quantized form: ``.weight`` is the packed ``uint32``
array of shape ``(out, in * bits / 32)``, with ``.scales`` and ``.biases`` of
shape ``(out, in / group_size)``; ``Checkpoint.quantization`` maps the layer
name (the weight name without ``.weight``) to its bits and group size. The
``.bias`` entries (attention biases, Qwen2) exist only when
``ModelConfig.attention_bias`` is set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from ..errors import ProgramError

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

_QUANT_BITS = (2, 3, 4, 5, 6, 8)
_QUANT_GROUP_SIZES = (32, 64, 128)


class ModelError(ProgramError):
    """A model file or directory cannot be loaded: it is missing, of an
    unsupported type or architecture, or its contents are inconsistent."""


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
    """Hyperparameters of a llama-family decoder (Llama, SmolLM2, Mistral, Qwen2).

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


@dataclass
class Checkpoint:
    """A loaded model: config, weights (see the module docstring for names),
    quantization per quantized layer, tokenizer, and where each weight came from.

    ``source_names`` maps every weight name to the tensor name in the file, so a
    program can bind captures straight from the model file.
    """

    path: Path
    config: ModelConfig
    weights: dict[str, mx.array]
    quantization: dict[str, Quantization]
    tokenizer: Tokenizer
    source_names: dict[str, str] = field(default_factory=dict)


def linear_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """Logical ``(out, in)`` shape of every matrix weight, by layer name (no ``.weight``)."""
    c = config
    q_out, kv_out = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes = {"embed_tokens": (c.vocab_size, c.hidden_size)}
    if not c.tie_embeddings:
        shapes["lm_head"] = (c.vocab_size, c.hidden_size)
    for i in range(c.num_layers):
        p = f"layers.{i}"
        shapes.update({
            f"{p}.self_attn.q_proj": (q_out, c.hidden_size),
            f"{p}.self_attn.k_proj": (kv_out, c.hidden_size),
            f"{p}.self_attn.v_proj": (kv_out, c.hidden_size),
            f"{p}.self_attn.o_proj": (c.hidden_size, q_out),
            f"{p}.mlp.gate_proj": (c.intermediate_size, c.hidden_size),
            f"{p}.mlp.up_proj": (c.intermediate_size, c.hidden_size),
            f"{p}.mlp.down_proj": (c.hidden_size, c.intermediate_size),
        })
    return shapes


def vector_shapes(config: ModelConfig) -> dict[str, tuple[int]]:
    """Shape of every vector weight (norms, attention biases), by full weight name."""
    c = config
    shapes = {"norm.weight": (c.hidden_size,)}
    for i in range(c.num_layers):
        p = f"layers.{i}"
        shapes[f"{p}.input_layernorm.weight"] = (c.hidden_size,)
        shapes[f"{p}.post_attention_layernorm.weight"] = (c.hidden_size,)
        if c.attention_bias:
            shapes[f"{p}.self_attn.q_proj.bias"] = (c.num_heads * c.head_dim,)
            shapes[f"{p}.self_attn.k_proj.bias"] = (c.num_kv_heads * c.head_dim,)
            shapes[f"{p}.self_attn.v_proj.bias"] = (c.num_kv_heads * c.head_dim,)
    return shapes


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


def check_weights(config: ModelConfig, weights: dict[str, mx.array],
                  where: str) -> dict[str, Quantization]:
    """Check that ``weights`` holds exactly the tensors ``config`` needs, with the
    right shapes; return the quantization of every quantized layer.

    ``where`` names the file in error messages.
    """
    expected = {f"{n}.weight" for n in linear_shapes(config)} | set(vector_shapes(config))
    quantized = {n for n in linear_shapes(config) if f"{n}.scales" in weights}
    expected |= {f"{n}.{part}" for n in quantized for part in ("scales", "biases")}
    missing, extra = sorted(expected - weights.keys()), sorted(weights.keys() - expected)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {_some(missing)}")
        if extra:
            parts.append(f"unexpected {_some(extra)}")
        raise ModelError(f"{where}: weights do not match the {config.architecture} config: "
                         + "; ".join(parts))

    quantization = {}
    for name, shape in linear_shapes(config).items():
        weight = weights[f"{name}.weight"]
        if name in quantized:
            quantization[name] = infer_quantization(
                f"{where}: {name}", weight, weights[f"{name}.scales"],
                weights[f"{name}.biases"], shape)
        elif tuple(weight.shape) != shape:
            raise ModelError(f"{where}: {name}.weight has shape {tuple(weight.shape)}, "
                             f"expected {shape}")
    for name, shape in vector_shapes(config).items():
        if tuple(weights[name].shape) != shape:
            raise ModelError(f"{where}: {name} has shape {tuple(weights[name].shape)}, "
                             f"expected {shape}")
    return quantization


def metadata_value(value: Any) -> Any:
    """A GGUF metadata value as plain Python: ``mx.load`` returns numbers as 0-d
    arrays and numeric lists as 1-d arrays; strings and string lists pass through."""
    if isinstance(value, mx.array):
        return value.item() if value.ndim == 0 else value.tolist()
    return value


def _some(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
