"""ONNX's element types as NumPy and the program format name them."""

from __future__ import annotations

import ml_dtypes
import mlx.core as mx
import numpy as np
import onnx

from .errors import OnnxImportError

_ONNX_TO_NUMPY = {
    onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.INT16: np.int16, onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.INT64: np.int64, onnx.TensorProto.UINT8: np.uint8,
    onnx.TensorProto.UINT16: np.uint16, onnx.TensorProto.UINT32: np.uint32,
    onnx.TensorProto.UINT64: np.uint64, onnx.TensorProto.BOOL: np.bool_,
    # ONNX's NumPy form of bfloat16 (numpy_helper, the reference evaluator).
    onnx.TensorProto.BFLOAT16: ml_dtypes.bfloat16,
}

#: NumPy dtypes of MLX's.
_MLX_TO_NUMPY = {
    mx.bool_: np.bool_, mx.uint8: np.uint8, mx.uint16: np.uint16, mx.uint32: np.uint32,
    mx.uint64: np.uint64, mx.int8: np.int8, mx.int16: np.int16, mx.int32: np.int32,
    mx.int64: np.int64, mx.float16: np.float16, mx.float32: np.float32,
    mx.float64: np.float64, mx.bfloat16: ml_dtypes.bfloat16,
}

#: bfloat16 as NumPy holds it (``ml_dtypes``: not a ``np.floating`` subtype).
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def is_float_dtype(dtype: np.dtype) -> bool:
    """Whether a NumPy dtype is a float type, bfloat16 included."""
    return np.issubdtype(dtype, np.floating) or np.dtype(dtype) == BFLOAT16


def numpy_dtype(elem_type: int, where: str) -> np.dtype:
    """The NumPy dtype of an ONNX element type; one MLX has no counterpart
    for (strings, 8-bit floats, complex128, ...) is an error naming ``where``."""
    if elem_type not in _ONNX_TO_NUMPY:
        name = onnx.TensorProto.DataType.Name(elem_type)
        raise OnnxImportError(f"{where}: element type {name} is not supported "
                              "(MLX has no such dtype)")
    return np.dtype(_ONNX_TO_NUMPY[elem_type])


def numpy_dtype_of(dtype: mx.Dtype) -> np.dtype:
    """The NumPy dtype of an MLX dtype."""
    return np.dtype(_MLX_TO_NUMPY[dtype])


def dtype_name(dtype: np.dtype) -> str:
    """The program format's name of a NumPy dtype."""
    return "bool" if dtype == np.bool_ else np.dtype(dtype).name
