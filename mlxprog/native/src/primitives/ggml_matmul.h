// The GGML block-quantized matmul's row driver, which the ggml_matmul
// primitive and the transformer layer share (ggml_matmul.cpp).
#pragma once

#include <cstdint>

#include "primitive.h"
#include "quants/quants.h"

namespace mlxprog {

// Columns [0, N) of y's M rows (row stride ldy) = x (M x K float32, dense)
// @ dequantize(w).T, w N rows of GGML type `type` (GGUF's id) in `table`'s
// kernels; int8: llama.cpp's numerics (x quantized into the type's
// activation blocks, integer dot products), else exact dequantization and
// float32 products (many rows: `kernels`' GEMM on dequantized panels). Runs
// on the thread pool.
void ggml_matmul_rows(const Kernels& kernels, const quants::QuantKernels& table, int type,
                      const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N,
                      bool int8, float* y, int64_t ldy);

}  // namespace mlxprog
