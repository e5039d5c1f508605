"""GGUF tensors as MLX arrays, each GGML type kept as its ``storage`` in
:mod:`.types` says: float types as MLX arrays; the ``"affine"`` types
(Q4_0, Q4_1, Q8_0) re-laid as MLX's affine quantization (``stem.weight``
packed ``uint32``, ``stem.scales``, ``stem.biases``: the same values, read
by the affine kernels); every other type as the file's own blocks (``uint8
[rows, row_bytes]``), read by the ``ggml_matmul`` / ``ggml_dequantize`` ops.
Where the native kernels run (the CPU, unless ``MLXPROG_NATIVE=0``) the
affine types stay blocks too: the GGML kernels decode them faster than
the affine ones read the re-laid form (docs/benchmarks.md, issue 35), the
file is not re-laid at load, and every layer's projections are of one
kind (a layer is then one ``transformer_layer`` node whatever its parts'
types). The same holds without the native kernels in a file that holds
block types (a K-quant mixture: its Q8_0 output or Q4_0 fallbacks beside
Q4_K). For a GPU device (no native kernels there) the block types MLX's
affine format holds exactly are re-laid as affine too, and the rest are
expanded to float16 with a one-line notice naming the types and the
memory cost.

Both the LLM loader and the weight binding of ``mlxprog.compile(...,
weights="model.gguf")`` read GGUF files through here, so a program exported
from a model binds the same arrays the model was built with.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

from .. import native as native_kernels
from ..errors import ModelError
from . import affine
from . import types as ggml_types
from .checks import first_nonfinite_block
from .dequantize import dequantize
from .gguf_file import GGUFFile, TensorInfo, open_gguf


def load_gguf_tensors(path: str | Path) -> tuple[dict[str, mx.array], dict[str, str]]:
    """Every tensor of the GGUF file at ``path`` as :func:`read_tensors`
    keeps it (for the default device, and the native kernels unless
    ``MLXPROG_NATIVE=0``), and the block type of each tensor kept as
    blocks."""
    with open_gguf(path) as gguf:
        return read_tensors(gguf, set(gguf.tensors), on_gpu=mx.default_device() != mx.cpu,
                            native=native_kernels.default_enabled())


def read_tensors(gguf: GGUFFile, names: set[str], *, on_gpu: bool, native: bool
                 ) -> tuple[dict[str, mx.array], dict[str, str]]:
    """The tensors ``names`` of an open file as MLX arrays, each kept as its
    type's storage says (``on_gpu``: as a GPU device can run them;
    ``native``: whether the native kernels run on the CPU; see the module
    docstring), and the GGML block type of each tensor kept as blocks. Each
    tensor's bytes are read once, straight into memory of its own (no
    mapping of the file stays alive)."""
    tensors: dict[str, mx.array] = {}
    block_types: dict[str, str] = {}
    expanded: dict[str, int] = {}
    all_blocks = not on_gpu and (native or any(gguf.tensors[name].type.storage == "blocks"
                                               for name in names))
    # Float tensors, and block tensors the model keeps as blocks, are read
    # straight into the arrays the model keeps (one copy); the rest are
    # converted.
    kept_as_read: list[TensorInfo] = []
    converted: list[TensorInfo] = []
    for name, info in gguf.tensors.items():
        if name in names:
            kept = info.type.storage == "float" or (
                not on_gpu and (info.type.storage == "blocks" or all_blocks))
            (kept_as_read if kept else converted).append(info)
    for info, array in zip(kept_as_read, _read_arrays(gguf, kept_as_read)):
        if info.type.storage == "float":
            tensors[info.name] = _as_float(info, array)
            continue
        _check_scales(gguf, info, np.asarray(array))
        tensors[info.name] = array
        block_types[info.name] = info.type.name
    for info in converted:
        name, t = info.name, info.type
        blocks = gguf.read(name)
        _check_scales(gguf, info, blocks)
        if (t.storage == "affine" and not all_blocks) or (on_gpu and
                                                          t.name in affine.affine_types()):
            stem = name[:-len(".weight")] if name.endswith(".weight") else name
            packed, scales, biases, _, _ = affine.to_affine(t.name, blocks)
            tensors[f"{stem}.weight"] = mx.array(packed)
            tensors[f"{stem}.scales"] = mx.array(scales)
            tensors[f"{stem}.biases"] = mx.array(biases)
        else:
            tensors[name] = _expanded(t, blocks)
            expanded[t.name] = expanded.get(t.name, 0) + int(np.prod(info.shape)) * 2
        del blocks
    if expanded:
        print(f"mlxprog: {', '.join(sorted(expanded))} tensors expanded to float16 for "
              f"{mx.default_device()} (no quantized kernels there): "
              f"{sum(expanded.values()) / 2**20:.0f} MiB", file=sys.stderr)
    return tensors, block_types


def float_tensor(gguf: GGUFFile, info: TensorInfo) -> mx.array:
    """A tensor of a float type (F32, F16, BF16) as an MLX array; any other
    type dequantized to float32."""
    if info.type.storage == "float":
        return _as_float(info, _read_arrays(gguf, [info])[0])
    data = gguf.read(info.name)
    _check_scales(gguf, info, data)
    return _expanded(info.type, data).astype(mx.float32)


# The MLX dtype a float type's bytes are read as (BF16's as bit patterns).
_FLOAT_STORAGE = {"F32": mx.float32, "F16": mx.float16, "BF16": mx.uint16}


def _as_float(info: TensorInfo, array: mx.array) -> mx.array:
    """A float tensor's array as read (:func:`_read_arrays`) as its float
    dtype: BF16's bit patterns viewed as bfloat16."""
    return array.view(mx.bfloat16) if info.type.name == "BF16" else array


def _read_arrays(gguf: GGUFFile, infos: list[TensorInfo]) -> list[mx.array]:
    """Each tensor's bytes read into a new MLX array (float types of their
    shape, as :data:`_FLOAT_STORAGE` says; blocks ``uint8 [...,
    row_bytes]``), through a numpy view of its memory. The arrays are
    made in one evaluation: one each cost more than the file's reads."""
    arrays = []
    for info in infos:
        dtype = _FLOAT_STORAGE.get(info.type.name, mx.uint8)
        shape = info.shape if dtype != mx.uint8 else (
            *info.shape[:-1], info.type.row_bytes(info.shape[-1]))
        arrays.append(mx.zeros(shape, dtype))
    mx.eval(arrays)
    for info, array in zip(infos, arrays):
        gguf.read_into(info.name, np.asarray(array))
    return arrays


def _expanded(t: ggml_types.GGMLType, blocks: np.ndarray) -> mx.array:
    """Block rows as float16 (dequantized with MLX ops on the CPU stream)."""
    with mx.stream(mx.cpu):
        out = dequantize(t.name, mx.array(blocks)).astype(mx.float16)
        mx.eval(out)
    return out


def _check_scales(gguf: GGUFFile, info: TensorInfo, blocks: np.ndarray) -> None:
    """A :class:`ModelError` naming the tensor and block when a block's scale
    is NaN or infinite (its values would be, silently)."""
    bad = first_nonfinite_block(info.type, blocks)
    if bad is not None:
        raise ModelError(f"{gguf.path}: tensor {info.name!r} ({info.type.name}): block {bad} "
                         "has a NaN or infinite scale")
