// portable TQ2_0 (2.06 bits/weight, ternary): per 256, 64 bytes of 2-bit
// codes q in {0, 1, 2} (bits 2j of byte 32g + m hold weight 128g + 32j + m),
// then an fp16 d; w = d * (q - 1).
#pragma once

#include "iq_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// visit(k, q) for each of a block's 256 weights k and its code q.
template <class Visit>
inline void visit_tq2_block(const uint8_t* block, Visit visit) {
  for (int g = 0; g < 2; ++g)
    for (int j = 0; j < 4; ++j)
      for (int m = 0; m < 32; ++m) visit(128 * g + 32 * j + m, (block[32 * g + m] >> (2 * j)) & 3);
}

// A row of TQ2_0 blocks to float32, as gguf computes it.
void dequantize_row_tq2_0(const uint8_t* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kTq2Bytes, y += kSuperBlock) {
    const float d = load_fp16(src + kTq2DOffset);
    visit_tq2_block(src, [&](int k, int32_t q) { y[k] = d * static_cast<float>(q - 1); });
  }
}

// TQ2_0 row . q8_K row (dot_ternary_row).
float vec_dot_tq2_0(int64_t n, const uint8_t* w, const void* x) {
  return dot_ternary_row<kTq2Bytes, kTq2DOffset>(
      n, w, x,
      [](const uint8_t* block, const int8_t* q8) {
        int32_t dot = 0;
        visit_tq2_block(block, [&](int k, int32_t q) { dot += q * q8[k]; });
        return dot;
      },
      load_fp16);
}

// A row of TQ2_0 blocks in the int8 GEMM's form (unpack_ternary_row).
void int8_unpack_row_tq2_0(const uint8_t* src, void* dst, int64_t n) {
  unpack_ternary_row<kTq2Bytes, kTq2DOffset>(
      src, dst, n,
      [](const uint8_t* block, int8_t* codes) {
        visit_tq2_block(block, [&](int k, int32_t q) { codes[k] = static_cast<int8_t>(q - 1); });
      },
      load_fp16);
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
