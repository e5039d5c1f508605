"""mlxprog.ggml.affine: the re-layout into MLX's affine quantization gives
llama.cpp's values (gguf-py's ``gguf.quants.dequantize``) through MLX's own
``dequantize`` and ``quantized_matmul``, and the same arrays as MLX's GGUF
loader (``mx.load``) for the types it re-lays itself."""

from __future__ import annotations

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from mlxprog.ggml.affine import affine_types, to_affine
from mlxprog.ggml.types import BY_NAME

#: Byte offsets of the fp16 fields of each affine type's block.
FP16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
               "Q4_K": (0, 2), "Q5_K": (0, 2)}
SCALE_DTYPE = {"Q4_0": np.float16, "Q4_1": np.float16, "Q5_0": np.float16,
               "Q5_1": np.float16, "Q8_0": np.float16, "Q4_K": np.float32, "Q5_K": np.float32}
BITS = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8, "Q4_K": 4, "Q5_K": 5}


def _blocks(name: str, rows: int, per_row: int, seed: int = 0, scale=None) -> np.ndarray:
    """A ``uint8 [rows, row_bytes]`` tensor of type ``name``: random code
    bytes, fp16 fields uniform in [-2, 2] with some +-0 (or ``scale``
    everywhere)."""
    t = BY_NAME[name]
    rng = np.random.default_rng(seed)
    n = rows * per_row
    b = rng.integers(0, 256, size=(n, t.block_bytes), dtype=np.uint8)
    for at in FP16_FIELDS[name]:
        d = rng.uniform(-2, 2, size=n).astype(np.float16)
        d[rng.permutation(n)[:2]] = (0.0, -0.0)
        if scale is not None:
            d[:] = scale
        b[:, at:at + 2] = d.view(np.uint8).reshape(n, 2)
    return b.reshape(rows, per_row * t.block_bytes)


def _reference(name: str, raw: np.ndarray) -> np.ndarray:
    return gguf.quants.dequantize(raw, GGMLQuantizationType[name])


def _dequantize_f32(w, scales, biases, bits, group_size) -> np.ndarray:
    # mx.dequantize computes in the scales' dtype: fp16 scales hold the
    # values exactly but would round the products.
    return np.array(mx.dequantize(mx.array(w), mx.array(scales).astype(mx.float32),
                                  mx.array(biases).astype(mx.float32),
                                  group_size=group_size, bits=bits))


def _assert_exact(got: np.ndarray, ref: np.ndarray) -> None:
    """Equal values; where the bits differ, llama.cpp's -0.0 (a negative
    scale times a zero code) is the affine form's +0.0."""
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert np.array_equal(got, ref)
    differ = got.view(np.uint32) != ref.view(np.uint32)
    assert np.all(ref[differ] == 0) and not np.signbit(got[differ]).any()


def test_affine_types():
    assert affine_types() == tuple(FP16_FIELDS)


@pytest.mark.parametrize("name", affine_types())
def test_round_trip(name):
    t = BY_NAME[name]
    per_row = 8 if t.block == 32 else 2
    raw = _blocks(name, 3, per_row)
    w, scales, biases, bits, group_size = to_affine(name, raw)
    k = per_row * t.block
    assert (bits, group_size) == (BITS[name], 32)
    assert w.dtype == np.uint32 and w.shape == (3, k * bits // 32)
    assert scales.dtype == biases.dtype == SCALE_DTYPE[name]
    assert scales.shape == biases.shape == (3, k // 32)
    ref = _reference(name, raw)
    _assert_exact(_dequantize_f32(w, scales, biases, bits, group_size), ref)
    # The matmul kernels compute in float32 with float32 inputs, whatever
    # the scales' dtype.
    rows = mx.quantized_matmul(mx.eye(k), mx.array(w), mx.array(scales), mx.array(biases),
                               transpose=True, group_size=group_size, bits=bits)
    _assert_exact(np.array(rows).T, ref)


def test_batch_axes():
    raw = _blocks("Q5_K", 6, 1).reshape(2, 3, 176)
    w, scales, biases, bits, group_size = to_affine("Q5_K", raw)
    assert w.shape == (2, 3, 40) and scales.shape == biases.shape == (2, 3, 8)
    _assert_exact(_dequantize_f32(w, scales, biases, bits, group_size), _reference("Q5_K", raw))


@pytest.mark.parametrize("name, zero", [("Q4_0", 8), ("Q5_0", 16), ("Q8_0", 128)])
def test_fp16_overflow_falls_back_to_float32(name, zero):
    # The largest fp16 scale whose bias -zero * d still is an fp16, and
    # the next one up.
    limit = np.float16(65504 / zero)
    for d, dtype in ((limit, np.float16), (np.nextafter(limit, np.float16(np.inf)), np.float32)):
        raw = _blocks(name, 2, 2, scale=d)
        w, scales, biases, bits, group_size = to_affine(name, raw)
        assert scales.dtype == biases.dtype == dtype
        _assert_exact(_dequantize_f32(w, scales, biases, bits, group_size), _reference(name, raw))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0"])
def test_same_arrays_as_mx_load(name, tmp_path):
    raw = _blocks(name, 3, 4, seed=2)
    path = str(tmp_path / "t.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("t", raw, raw_dtype=GGMLQuantizationType[name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    loaded = mx.load(path)
    ours = to_affine(name, raw)
    for got, theirs in zip(ours, (loaded["t"], loaded["t.scales"], loaded["t.biases"])):
        theirs = np.array(theirs)
        assert got.dtype == theirs.dtype and got.shape == theirs.shape
        assert np.array_equal(got.view(np.uint8), theirs.view(np.uint8))


@pytest.mark.parametrize("name, blocks, match", [
    ("MXFP4", np.zeros((1, 17), np.uint8), "'MXFP4' has no exact MLX affine form"),
    ("Q6_K", np.zeros((1, 210), np.uint8), "'Q6_K' has no exact MLX affine form"),
    ("Q8_0", np.zeros((1, 35), np.uint8), "Q8_0 row_bytes 35 is not a whole number"),
    ("Q4_1", np.zeros((1, 20), np.int8), "Q4_1 blocks must be uint8"),
])
def test_errors(name, blocks, match):
    with pytest.raises(ValueError, match=match):
        to_affine(name, blocks)
