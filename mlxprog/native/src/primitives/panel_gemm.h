// The float GEMM over a weight matrix kept in some packed form (GGML blocks,
// MLX's affine codes): panels of weight rows are dequantized once per call
// and multiplied by every row of x with the float GEMM's register tiles. A
// prefill (many rows of x) runs far faster this way than one dot product
// per (row of x, weight row) pair, which decodes each weight row M times.
#pragma once

#include <cstdint>
#include <functional>

#include "primitive.h"

namespace mlxprog {

// From this many rows of x on, the float numerics of a packed matmul take
// panel_gemm rather than per-row dot products.
constexpr int64_t kPanelGemmMinRows = 8;

// Writes weight row n (K floats, dequantized) to dst. Called from the pool's
// threads, each with its own dst.
using RowDequantizer = std::function<void(int64_t n, float* dst)>;

// y[m * ldy + n] = sum_k x[m * K + k] * row_n[k] for m < M, n < N, with
// row_n as `dequantize_row` writes it; on the thread pool.
void panel_gemm(const Kernels& kernels, const float* x, int64_t M, int64_t K, int64_t N,
                const RowDequantizer& dequantize_row, float* y, int64_t ldy);

}  // namespace mlxprog
