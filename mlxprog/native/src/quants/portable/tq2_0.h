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
    const float d = load_fp16(src + 64);
    visit_tq2_block(src, [&](int k, int32_t q) { y[k] = d * static_cast<float>(q - 1); });
  }
}

// TQ2_0 row . q8_K row: per block sum (q - 1) * x = sum q * x - sum x in
// integers, one float product per block.
float vec_dot_tq2_0(int64_t n, const uint8_t* w, const void* xv) {
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, w += kTq2Bytes) {
    const int8_t* q8 = x[i].qs;
    int32_t dot = 0;
    visit_tq2_block(w, [&](int k, int32_t q) { dot += q * q8[k]; });
    sum += load_fp16(w + 64) * x[i].d * static_cast<float>(dot - q8k_code_sum(x[i]));
  }
  return sum;
}

// A row of TQ2_0 blocks in the int8 GEMM's form: codes q - 1, every group's
// scale 1, d.
void int8_unpack_row_tq2_0(const uint8_t* src, void* dst, int64_t n) {
  static constexpr int kOnes[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kTq2Bytes) {
    int8_t* codes = out[i].codes;
    visit_tq2_block(src, [&](int k, int32_t q) { codes[k] = static_cast<int8_t>(q - 1); });
    set_iq_int8_groups(kOnes, 8, load_fp16(src + 64), out[i]);
  }
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
