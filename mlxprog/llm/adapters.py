"""LoRA adapters, read from mlx-lm's or PEFT's directory format and fused
into a loaded checkpoint's weights.

An adapter directory holds ``adapter_config.json`` and its weights:

mlx-lm (``mlx_lm.lora``)
    ``adapters.safetensors`` with ``model.layers.N.self_attn.q_proj.lora_a``
    ([in, r]) and ``...lora_b`` ([r, out]); the config's
    ``lora_parameters`` give ``rank`` and ``scale``, ``fine_tune_type``
    must be ``lora``. mlx-lm's ``LoRALinear`` computes
    ``y = x W^T + scale * (x @ lora_a) @ lora_b``.
PEFT (``peft``'s ``save_pretrained``)
    ``adapter_model.safetensors`` with
    ``base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight``
    ([r, in]) and ``...lora_B.weight`` ([out, r]); the config's ``r`` and
    ``lora_alpha`` give the scale ``lora_alpha / r`` (``lora_alpha /
    sqrt(r)`` with ``use_rslora``): ``y = x W^T + scale * x A^T B^T``.

Both come down to one update per adapted projection, ``W' = W + scale * B
@ A`` (``B`` = [out, r], ``A`` = [r, in]), which :func:`apply_adapter`
adds to the checkpoint's weights at load, so the programs run exactly as
for a model without an adapter. A quantized layer (a GGUF Q4_1 file's, an
MLX-quantized checkpoint's) is dequantized, updated in float32 and
quantized again with its own bits and group size; that rounding is the
one cost in accuracy (docs/llm.md, "LoRA adapters").

Adapters name projections as Hugging Face checkpoints do; the family's
weight table (:mod:`mlxprog.llm.models`) maps them to its logical layers,
the rows of a projection stored fused (Phi-3's ``qkv_proj``) included. A
llama GGUF file holds its q/k rows permuted into the interleaved RoPE
layout (llama.cpp's converter), so the update's rows are permuted alike.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx
import numpy as np

from ..arrays import is_int, name_of
from ..errors import ModelError, SettingError
from ..ggml import affine
from ..ggml import types as ggml_types
from ..ggml.dequantize import dequantize as dequantize_blocks
from ..runtime.binding import weights_file_problem
from .checkpoint import Checkpoint, GGMLQuantization, Quantization
from .config import ModelConfig
from .hf import read_json_object
from .models import family_of
from .models.base import Source, expand

ADAPTER_CONFIG = "adapter_config.json"
#: The weights file of each format.
WEIGHTS_FILES = {"mlx-lm": "adapters.safetensors", "peft": "adapter_model.safetensors"}
#: The suffix on the capture names of an adapted layer's arrays: a program
#: built for the adapted model never binds the file's own tensor by name.
ADAPTED = ":lora"

AdapterFormat = Literal["mlx-lm", "peft"]
# The adapter file's key suffixes of the two matrices, by format.
_MLX_LM_PARTS = {"lora_a": "down", "lora_b": "up"}
_PEFT_PARTS = {"lora_A.weight": "down", "lora_B.weight": "up"}
_PEFT_PREFIX = "base_model.model."


def _error(problem: str) -> SettingError:
    """A bad adapter, reported under :func:`~mlxprog.llm.load`'s
    ``adapter_path`` parameter (the CLI's ``--adapter-path``)."""
    return SettingError("adapter_path", problem)


@dataclass(frozen=True)
class LoRA:
    """One adapted projection: its update ``scale * up @ down``. ``module``
    is the projection's Hugging Face name (``model.layers.0.self_attn.q_proj``),
    ``down`` the [r, in] matrix (PEFT's A, mlx-lm's ``lora_a`` transposed),
    ``up`` the [out, r] one (B, ``lora_b`` transposed); ``keys`` names them
    in the adapter file, for errors."""

    module: str
    down: mx.array
    up: mx.array
    scale: float
    keys: str

    @property
    def rank(self) -> int:
        """The update's rank r."""
        return self.down.shape[0]

    def delta(self) -> mx.array:
        """The float32 [out, in] update to the projection's weight."""
        return self.scale * (self.up.astype(mx.float32) @ self.down.astype(mx.float32))


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter read by :func:`load_adapter`: where it is, its format,
    its weights file, the projections it updates, and the base model and
    layer count its config names (None where it names none)."""

    path: Path
    format: AdapterFormat
    weights_file: Path
    layers: tuple[LoRA, ...]
    base_model: str | None = None
    num_layers: int | None = None


def load_adapter(path: str | Path) -> Adapter:
    """Read the LoRA adapter in directory ``path``, in mlx-lm's format
    (``adapters.safetensors``) or PEFT's (``adapter_model.safetensors``),
    each with ``adapter_config.json``. Everything that does not depend on
    the base model is checked here: the files, the config (a DoRA or full
    fine-tune, PEFT options that change the update, are refused), every key
    of the weights file (a LoRA matrix of finite floating-point values),
    and each pair's ranks. Problems raise
    :class:`~mlxprog.llm.SettingError` for ``adapter_path``, naming
    the file."""
    path = Path(path)
    if not path.is_dir():
        raise _error(f"{path}: no such adapter directory" if not path.exists() else
                     f"{path}: an adapter is a directory ({ADAPTER_CONFIG} and its "
                     "weights), not a file")
    config_path = path / ADAPTER_CONFIG
    if not config_path.is_file():
        raise _error(f"{path}: no {ADAPTER_CONFIG} (an mlx-lm or PEFT adapter directory "
                     "has one)")
    try:
        config = read_json_object(config_path)
    except ModelError as e:  # reported under adapter_path
        raise _error(str(e)) from None
    found = [kind for kind, name in WEIGHTS_FILES.items() if (path / name).is_file()]
    if not found:
        extra = (" (adapter_model.bin, PyTorch's pickle format, is not read: save the "
                 "adapter with safe_serialization=True)"
                 if (path / "adapter_model.bin").exists() else "")
        raise _error(f"{path}: no adapter weights: expected "
                     f"{' or '.join(WEIGHTS_FILES.values())}{extra}")
    if len(found) > 1:
        # Each format has a config of its own: reading one file with the
        # other's config would fail on a key that has nothing to do with it.
        raise _error(f"{path}: holds both {' and '.join(WEIGHTS_FILES.values())}; an "
                     "adapter directory holds one (mlx-lm's or PEFT's): remove the other")
    kind: AdapterFormat = found[0]
    weights_file = path / WEIGHTS_FILES[kind]
    problem = weights_file_problem(weights_file)
    if problem is not None:
        raise _error(f"cannot read {weights_file}: {problem}")
    try:
        tensors = mx.load(str(weights_file))
    except (RuntimeError, ValueError) as e:
        raise _error(f"cannot read {weights_file}: {e}") from None
    if kind == "mlx-lm":
        rank, scale, num_layers, base_model = _mlx_lm_settings(config, config_path)
        layers = _pairs(tensors, weights_file, _MLX_LM_PARTS, "", transposed=True,
                        scale=scale)
    else:
        rank, scale, base_model = _peft_settings(config, config_path)
        num_layers = None
        layers = _pairs(tensors, weights_file, _PEFT_PARTS, _PEFT_PREFIX, transposed=False,
                        scale=scale)
    for layer in layers:
        if layer.rank != rank:
            raise _error(f"{weights_file}: {layer.keys} have rank {layer.rank}, but "
                         f"{config_path} says {rank}")
    return Adapter(path, kind, weights_file, layers, base_model, num_layers)


def _mlx_lm_settings(config: Mapping[str, Any], where: Path
                     ) -> tuple[int, float, int | None, str | None]:
    """(rank, scale, num_layers, base model) of an mlx-lm adapter config."""
    kind = config.get("fine_tune_type", "lora")
    if config.get("use_dora"):  # mlx-lm's configs before fine_tune_type
        kind = "dora"
    if kind != "lora":
        raise _error(f"{where}: fine_tune_type {kind!r} is not supported; only 'lora' "
                     "adapters are fused (fuse others into the model with mlx_lm.fuse)")
    parameters = config.get("lora_parameters")
    if not isinstance(parameters, dict):
        raise _error(f"{where}: lora_parameters must be an object with rank and scale, "
                     f"got {parameters!r}")
    rank = _rank(parameters.get("rank"), "lora_parameters.rank", where)
    scale = _number(parameters.get("scale"), "lora_parameters.scale", where)
    num_layers = config.get("num_layers")
    if num_layers is not None and (not is_int(num_layers) or
                                   (num_layers < 1 and num_layers != -1)):
        raise _error(f"{where}: num_layers must be a positive integer or -1 (every layer), "
                     f"got {num_layers!r}")
    return rank, scale, None if num_layers == -1 else num_layers, config.get("model")


def _peft_settings(config: Mapping[str, Any], where: Path) -> tuple[int, float, str | None]:
    """(rank, scale, base model) of a PEFT adapter config."""
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise _error(f"{where}: peft_type {peft_type!r} is not supported (LORA)")
    # Each of these changes the update beyond W + scale * B @ A, or the model
    # it applies to.
    unsupported = {"use_dora": "DoRA", "fan_in_fan_out": "transposed (Conv1D) weights",
                   "use_qalora": "QA-LoRA", "rank_pattern": "per-module ranks",
                   "alpha_pattern": "per-module alphas",
                   "modules_to_save": "fully trained modules",
                   "layer_replication": "replicated layers"}
    for key, what in unsupported.items():
        if config.get(key):
            raise _error(f"{where}: {key} = {config[key]!r} is not supported ({what})")
    if config.get("bias", "none") != "none":
        raise _error(f"{where}: bias {config['bias']!r} is not supported (trained biases); "
                     "only bias 'none'")
    rank = _rank(config.get("r"), "r", where)
    # Required: PEFT reads a config without lora_alpha as lora_alpha 8 (its
    # default), which no reader could guess was meant; PEFT always saves it.
    alpha = _number(config.get("lora_alpha"), "lora_alpha", where)
    rslora = config.get("use_rslora", False)
    if not isinstance(rslora, bool):  # a string "false" would pass as true
        raise _error(f"{where}: use_rslora must be true or false, got {rslora!r}")
    scale = alpha / math.sqrt(rank) if rslora else alpha / rank
    return rank, scale, config.get("base_model_name_or_path")


def _rank(value: Any, name: str, where: Path) -> int:
    """Config entry ``name``, a rank: a positive integer that can be a
    matrix's dimension (MLX's are int32; a larger one from JSON would
    overflow a float in rsLoRA's ``sqrt(r)``)."""
    if not is_int(value) or not 1 <= value < 2 ** 31:
        raise _error(f"{where}: {name} must be a positive integer below 2**31, got "
                     f"{value!r:.60}")
    return value


def _number(value: Any, name: str, where: Path) -> float:
    """Config entry ``name``, a finite number: Python's JSON reader takes
    NaN and Infinity, which would make every adapted weight NaN, and
    integers no float holds. (NaN fails every comparison.)"""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not abs(value) <= sys.float_info.max:
        raise _error(f"{where}: {name} must be a finite number, got {value!r:.60}")
    return float(value)


def _pairs(tensors: Mapping[str, mx.array], where: Path, parts: Mapping[str, str],
           prefix: str, transposed: bool, scale: float) -> tuple[LoRA, ...]:
    """The adapter file's ``tensors`` as one :class:`LoRA` per module: keys
    are ``prefix + module + "." + part`` for the ``parts`` (suffix -> down
    or up); mlx-lm's matrices are stored ``transposed`` relative to PEFT's."""
    modules: dict[str, dict[str, tuple[str, mx.array]]] = {}
    for key, value in tensors.items():
        suffix = next((s for s in parts if key.endswith(f".{s}")), None)
        module = key[len(prefix):-len(suffix) - 1] if suffix and key.startswith(prefix) else ""
        if not module:
            expected = " or ".join(f"{prefix}<module>.{s}" for s in parts)
            raise _error(f"{where}: {key} is not a LoRA matrix (expected {expected})")
        if value.ndim != 2:
            raise _error(f"{where}: {key} has shape {tuple(value.shape)}, expected a matrix")
        # An integer, boolean or complex matrix is no trained LoRA weight:
        # converting it to float32 would fuse something else.
        if not mx.issubdtype(value.dtype, mx.floating):
            raise _error(f"{where}: {key} is {name_of(value.dtype)}, expected a floating-point "
                         "matrix (float32, float16 or bfloat16)")
        if not mx.all(mx.isfinite(value)).item():
            raise _error(f"{where}: {key} holds NaN or infinite values (a diverged training "
                         "run?): fusing it would make the model's output NaN")
        modules.setdefault(module, {})[parts[suffix]] = (key, value.T if transposed else value)
    if not modules:
        raise _error(f"{where}: holds no LoRA matrices")
    layers = []
    for module, found in sorted(modules.items()):
        for role in ("down", "up"):
            if role not in found:
                other = next(iter(found.values()))[0]
                raise _error(f"{where}: {other} has no matching "
                             f"{prefix}{module}.{_suffix(parts, role)}")
        (down_key, down), (up_key, up) = found["down"], found["up"]
        if down.shape[0] != up.shape[1]:
            raise _error(f"{where}: rank mismatch: {down_key} has rank {down.shape[0]} "
                         f"(shape {tuple(tensors[down_key].shape)}), {up_key} rank "
                         f"{up.shape[1]} (shape {tuple(tensors[up_key].shape)})")
        layers.append(LoRA(module, down, up, scale, f"{down_key} / {up_key}"))
    return tuple(layers)


def _suffix(parts: Mapping[str, str], role: str) -> str:
    return next(s for s, r in parts.items() if r == role)


# -- fusing into a checkpoint ---------------------------------------------------

def apply_adapter(checkpoint: Checkpoint, adapter: Adapter, source: Source) -> Checkpoint:
    """``checkpoint`` (read from a ``source`` file: ``"hf"`` or ``"gguf"``)
    with ``adapter`` fused into its weights: each adapted projection's
    weight becomes ``W + scale * B @ A`` in its stored dtype, a quantized
    one dequantized, updated in float32 and quantized again with its own
    bits and group size (see :func:`requantize`). The adapted arrays' capture names end in
    :data:`ADAPTED`. An adapter that does not fit the model (a projection
    it has not, other shapes, more layers) raises
    :class:`~mlxprog.llm.SettingError` for ``adapter_path`` before
    any weight changes."""
    config = checkpoint.config
    where = adapter.weights_file
    trained_for = f" (trained for {adapter.base_model})" if adapter.base_model else ""
    if adapter.num_layers is not None and adapter.num_layers > config.num_layers:
        raise _error(f"{adapter.path / ADAPTER_CONFIG}: num_layers {adapter.num_layers} is "
                     f"more than the model's {config.num_layers} layers{trained_for}")
    projections = _projections(config)
    updates: dict[str, mx.array] = {}
    for layer in adapter.layers:
        targets = projections.get(layer.module)
        if targets is None:
            raise _error(f"{where}: {layer.keys} adapt {layer.module}, which the "
                         f"{config.architecture} model {checkpoint.path} has no projection "
                         f"named{trained_for} (it has {_examples(projections)})")
        out_rows = max(end for _, (_, end) in targets)
        in_features = _in_features(checkpoint, targets[0][0])
        expected = (out_rows, in_features)
        got = (layer.up.shape[0], layer.down.shape[1])
        if got != expected:
            raise _error(f"{where}: {layer.keys} update a {got[0]} x {got[1]} weight, but "
                         f"{layer.module} of {checkpoint.path} is {expected[0]} x "
                         f"{expected[1]} (out x in): the adapter is for another model"
                         f"{trained_for}")
        delta = layer.delta()
        for name, (start, end) in targets:
            part = delta[start:end]
            if source == "gguf" and config.rope_traditional:
                part = _interleave_rope_rows(name, part, config)
            updates[name] = part
    weights = dict(checkpoint.weights)
    names = dict(checkpoint.source_names)
    quantization = dict(checkpoint.quantization)
    fused: list[mx.array] = []
    for name, delta in updates.items():
        arrays, quant = fuse(checkpoint, name, delta)
        for key, value in arrays.items():
            weights[key] = value
            names[key] = names.get(key, key) + ADAPTED
        fused += arrays.values()
        if quant is None:
            quantization.pop(name, None)
        else:
            quantization[name] = quant
    mx.eval(fused)
    return replace(checkpoint, weights=weights, source_names=names, adapter_path=adapter.path,
                   quantization=quantization)


def fuse(checkpoint: Checkpoint, name: str, delta: mx.array
         ) -> tuple[dict[str, mx.array], Quantization | None]:
    """The arrays of projection ``name`` (a logical layer) of ``checkpoint``
    with the float32 ``delta`` added to its weight, and the layer's
    quantization afterwards (None: float): ``.weight`` in its dtype, or for
    a quantized layer ``.weight``, ``.scales`` and ``.biases`` of
    ``dequantize(W) + delta`` quantized with the layer's bits and group
    size. A layer kept in a GGUF file's blocks is first re-laid as MLX's
    affine form where that holds its type exactly (Q4_0, Q4_1, Q5_0, Q5_1,
    Q8_0, Q4_K, Q5_K: the same values) and requantized so; one of another
    GGML type becomes a float16 ``.weight``."""
    weight = checkpoint.weights[f"{name}.weight"]
    quant = checkpoint.quantization.get(name)
    if quant is None:
        return {f"{name}.weight": (weight.astype(mx.float32) + delta).astype(weight.dtype)}, None
    if isinstance(quant, GGMLQuantization):
        if quant.type not in affine.affine_types():
            dense = dequantize_blocks(quant.type, weight)
            return {f"{name}.weight": (dense + delta).astype(mx.float16)}, None
        packed, scales_np, biases_np, bits, group_size = affine.to_affine(quant.type,
                                                                          np.array(weight))
        weight, scales, biases = mx.array(packed), mx.array(scales_np), mx.array(biases_np)
        quant = Quantization(bits, group_size)
    else:
        scales, biases = (checkpoint.weights[f"{name}.{p}"] for p in ("scales", "biases"))
    dense = mx.dequantize(weight, scales, biases, group_size=quant.group_size, bits=quant.bits)
    packed, new_scales, new_biases = requantize(dense.astype(mx.float32) + delta, scales,
                                                biases, quant)
    return {f"{name}.weight": packed, f"{name}.scales": new_scales,
            f"{name}.biases": new_biases}, quant


def requantize(dense: mx.array, scales: mx.array, biases: mx.array,
               quant: Quantization) -> tuple[mx.array, mx.array, mx.array]:
    """The float32 [out, in] ``dense`` quantized as MLX packs a layer of
    ``quant``'s bits and group size, onto each group's own grid (its
    ``scales`` and ``biases``, in their dtypes) where the group's values fit
    in it, else onto a new grid from the group's min to its max (GGUF's Q4_1
    rule): every value lands within half a step of its own, and a group the
    update leaves unchanged comes back exactly as it was. (``mx.quantize``
    would put every group on a grid of its own making, which keeps zero
    exact, and so move each weight of an unchanged layer by a quarter step
    on average.)"""
    group, bits = quant.group_size, quant.bits
    levels = 2 ** bits - 1
    out_features, in_features = dense.shape
    w = dense.reshape(out_features, in_features // group, group)
    scale, bias = scales.astype(mx.float32)[..., None], biases.astype(mx.float32)[..., None]
    codes = (w - bias) / mx.where(scale == 0, 1.0, scale)
    fits = (scale != 0) & mx.all((codes >= -0.5) & (codes <= levels + 0.5), axis=-1,
                                 keepdims=True)
    low, high = mx.min(w, axis=-1, keepdims=True), mx.max(w, axis=-1, keepdims=True)
    # The stored dtypes' values: the codes are rounded on the grid the
    # kernels will read.
    new_scale = mx.maximum((high - low) / levels, 1e-8).astype(scales.dtype).astype(mx.float32)
    new_bias = low.astype(biases.dtype).astype(mx.float32)
    scale, bias = mx.where(fits, scale, new_scale), mx.where(fits, bias, new_bias)
    q = mx.clip(mx.round((w - bias) / scale), 0, levels).astype(mx.uint64)
    return (_pack(q.reshape(out_features, in_features), bits),
            scale[..., 0].astype(scales.dtype), bias[..., 0].astype(biases.dtype))


def _pack(codes: mx.array, bits: int) -> mx.array:
    """The [out, in] ``codes`` (uint64, each below ``2 ** bits``) packed as
    MLX packs a quantized weight, for every bit width (3, 5 and 6 too): a
    little-endian stream of ``bits``-bit fields, the first code in the
    lowest bits of the first uint32 word, a field running on into the next
    word where it does not fit."""
    out_features, in_features = codes.shape
    # Eight codes fill ``bits`` whole bytes (at most 64 bits): each eight are
    # summed, shifted to their places, into one uint64 (their bits are
    # disjoint), which is cut into bytes, and every four bytes make a word.
    eights = codes.reshape(out_features, in_features // 8, 8)
    stream = mx.sum(mx.left_shift(eights, mx.arange(8, dtype=mx.uint64) * bits), axis=-1)
    octets = mx.right_shift(stream[..., None], mx.arange(bits, dtype=mx.uint64) * 8) & 0xFF
    octets = octets.reshape(out_features, in_features * bits // 32, 4)
    words = mx.sum(mx.left_shift(octets, mx.arange(4, dtype=mx.uint64) * 8), axis=-1)
    return words.astype(mx.uint32)


def _projections(config: ModelConfig) -> dict[str, list[tuple[str, tuple[int, int]]]]:
    """The model's projections by Hugging Face module name (what adapters
    name them): the logical layers each stored tensor holds, with their
    rows of it (all of them but in a fused ``qkv_proj``). Embeddings are
    left out: an adapter of an embedding is no low-rank matmul update."""
    out: dict[str, list[tuple[str, tuple[int, int]]]] = {}
    for entry in expand(family_of(config).weights(config), config, "hf"):
        if not entry.weight.matrix or entry.name == "embed_tokens" or entry.stored is None:
            continue
        rows = entry.weight.hf_rows(config) if entry.weight.hf_rows else (
            0, entry.weight.shape(config)[0])
        out.setdefault(entry.stored, []).append((entry.name, rows))
    return out


def _in_features(checkpoint: Checkpoint, name: str) -> int:
    weight = checkpoint.weights[f"{name}.weight"]
    quant = checkpoint.quantization.get(name)
    if isinstance(quant, GGMLQuantization):
        t = ggml_types.BY_NAME[quant.type]
        return weight.shape[1] // t.block_bytes * t.block
    return weight.shape[1] if quant is None else weight.shape[1] * 32 // quant.bits


def _interleave_rope_rows(name: str, delta: mx.array, config: ModelConfig) -> mx.array:
    """The rows of a q/k projection's update in the order a llama GGUF file
    stores them: llama.cpp's converter (``LlamaModel.permute``) reorders
    each head's rows from the half-split RoPE layout (Hugging Face's) into
    the interleaved one, row ``j * D/2 + k`` of a head to ``2k + j``.
    Other projections keep theirs."""
    if name.endswith("self_attn.q_proj"):
        heads = config.num_heads
    elif name.endswith("self_attn.k_proj"):
        heads = config.num_kv_heads
    else:
        return delta
    out, in_features = delta.shape
    return (delta.reshape(heads, 2, out // heads // 2, in_features).swapaxes(1, 2)
            .reshape(out, in_features))


def _examples(projections: Mapping[str, Any], limit: int = 3) -> str:
    names = sorted(projections)
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")
