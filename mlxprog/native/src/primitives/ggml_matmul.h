// The GGML block-quantized matmul's row drivers (ggml_matmul.cpp): the dense
// one, which the ggml_matmul primitive and the transformer layer share, and
// the mixture-of-experts one of ggml_gather_matmul.
#pragma once

#include <cstdint>
#include <vector>

#include "primitive.h"
#include "primitives/expert_slots.h"
#include "quants/quants.h"

namespace mlxprog {

// One of the matrices a matmul applies to the same x: `rows` weight rows of
// GGML type `type` (GGUF's id) at w.
struct GgmlPart {
  int type;
  const uint8_t* w;
  int64_t rows;
};

// ggml_matmul_rows of each part in turn, the parts' products side by side in
// y (row stride ldy): part i fills the columns after part i - 1's. The
// parts' few-row tiles (a decode step) run as one pool job and their exact
// panels as one GEMM (x packed once), where part by part each would wait
// for the pool on its own.
void ggml_matmul_parts(const Kernels& kernels, const quants::QuantKernels& table,
                       const std::vector<GgmlPart>& parts, const float* x, int64_t M, int64_t K,
                       bool int8, float* y, int64_t ldy);

// Columns [0, N) of y's M rows (row stride ldy) = x (M x K float32, dense)
// @ dequantize(w).T, w N rows of GGML type `type` (GGUF's id) in `table`'s
// kernels; int8: llama.cpp's numerics (x quantized into the type's
// activation blocks, integer dot products), else exact dequantization and
// float32 products (many rows: `kernels`' GEMM on dequantized panels). Runs
// on the thread pool.
void ggml_matmul_rows(const Kernels& kernels, const quants::QuantKernels& table, int type,
                      const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N,
                      bool int8, float* y, int64_t ldy);

// Mixture-of-experts slots: for each slot s of `slots`, y row s (N floats)
// = its row of x (`rows` dense rows of K float32: one per token, or
// per_slot one per slot) @ dequantize(its expert of w).T, w the experts' N
// rows of GGML type `type` one after another. Reads only the experts some
// slot picks, each once for all its slots; int8 as ggml_matmul_rows, each
// row of x quantized once. Runs on the thread pool.
void ggml_gather_rows(const Kernels& kernels, const quants::QuantKernels& table, int type,
                      const float* x, int64_t rows, int64_t K, const uint8_t* w, int64_t N,
                      const ExpertSlots& slots, bool per_slot, bool int8, float* y);

}  // namespace mlxprog
