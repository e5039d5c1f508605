// The quantized matmul in MLX's affine format (a transformer layer's
// projections run it too): PackedMatrix and run_qmm.
#pragma once

#include <cstdint>
#include <vector>

#include "primitive.h"

namespace mlxprog {

// A quantized matmul's operands as the kernels read them: packed codes and
// per-group scales and biases, row-contiguous.
struct PackedMatrix {
  const uint8_t* w;
  const void* scales;
  const void* biases;
  DType scales_dtype, biases_dtype;
  int bits, group_size;
};

// out (M x N float32) = x (M x K, `x_dtype`) @ dequantize(m).T (transpose)
// or x @ dequantize(m); `int8`: the int8 numerics (transpose, 4 or 8 bits).
// Runs on the calling thread and the pool.
void run_qmm(const void* x, DType x_dtype, int64_t M, int64_t K, int64_t N,
             const PackedMatrix& m, bool transpose, bool int8, float* out);

}  // namespace mlxprog
