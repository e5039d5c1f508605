// GGML block-quantized matmul and dequantization primitives (quant_matmul.cpp).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>

#include "kernels.h"
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

// Register ggml_matmul, ggml_dequantize, set_codebook and ggml_type_ids on
// the extension's module; `active` points at the kernel table in use (its
// ISA picks the quant table when a primitive is built).
void bind_quants(nanobind::module_& m, const Kernels* const* active);

}  // namespace mlxprog
