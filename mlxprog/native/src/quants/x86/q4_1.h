// x86 Q4_1 (see portable/q4_1.h): codes q as unsigned bytes.
#pragma once

#include "block32.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace block32 {

// A Q4_1 block's 32 codes, as unsigned bytes.
inline __m256i q4_1_codes(const uint8_t* block) { return nibbles_32(block + 4); }

// A row of Q4_1 blocks to float32, as gguf computes it.
void dequantize_row_q4_1(const uint8_t* src, float* y, int64_t n) {
  dequantize_blocks_with_min<kQ4_1Bytes>(src, y, n, q4_1_codes);
}

// Q4_1 row . q8_1 row.
float vec_dot_q4_1(int64_t n, const uint8_t* w, const void* x) {
  return dot_unsigned_blocks_q8_1<kQ4_1Bytes>(n, w, static_cast<const BlockQ8_1*>(x), q4_1_codes);
}

// A row of Q4_1 blocks in the int8 GEMM's form: codes q (0..15), d and m.
void int8_unpack_row_q4_1(const uint8_t* src, void* dst, int64_t n) {
  unpack_blocks<kQ4_1Bytes>(
      src, dst, n, [](const uint8_t* block) { return q4_1_codes(block); }, Fp16Scale(),
      [](const uint8_t* block) { return fp16_scale(block + 2); });
}

}  // namespace block32
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
