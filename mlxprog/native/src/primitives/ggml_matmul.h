// The GGML block-quantized matmul's row drivers (ggml_matmul.cpp): the dense
// one, which the ggml_matmul primitive and the transformer layer share, and
// the mixture-of-experts one of ggml_gather_matmul.
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

// Mixture-of-experts slots: for s < slots, y row s (N floats) = x row
// s / slots_per_row (of `rows` dense rows of K float32) @ dequantize(expert
// experts[s] of w).T, w E experts of N rows of GGML type `type`, experts[s]
// in [0, E). Reads only the experts some slot picks, each once for all its
// slots (the slots grouped by expert); int8 as ggml_matmul_rows, each row of
// x quantized once. Runs on the thread pool.
void ggml_gather_rows(const Kernels& kernels, const quants::QuantKernels& table, int type,
                      const float* x, int64_t rows, int64_t K, const uint8_t* w, int64_t E,
                      int64_t N, const int64_t* experts, int64_t slots, int64_t slots_per_row,
                      bool int8, float* y);

}  // namespace mlxprog
