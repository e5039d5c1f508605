// x86 Q4_0 (see portable/q4_0.h): codes q - 8 as signed bytes.
#pragma once

#include "block32.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace block32 {

// A Q4_0 block's 32 codes minus 8, as signed bytes.
inline __m256i q4_0_codes(const uint8_t* block) {
  return _mm256_sub_epi8(nibbles_32(block + 2), _mm256_set1_epi8(8));
}

// A row of Q4_0 blocks to float32, as gguf computes it.
void dequantize_row_q4_0(const uint8_t* src, float* y, int64_t n) {
  dequantize_blocks<kQ4_0Bytes>(src, y, n, q4_0_codes, fp16_scale);
}

// Q4_0 row . q8_0 row.
float vec_dot_q4_0(int64_t n, const uint8_t* w, const void* x) {
  return dot_signed_blocks<kQ4_0Bytes>(n, w, static_cast<const BlockQ8_0*>(x), q4_0_codes,
                                       fp16_scale);
}

// Four Q4_0 rows . one q8_0 row: the codes unsigned, offset 8 (see
// dot_signed_blocks_x4).
void vec_dot_4_q4_0(int64_t n, const uint8_t* w, int64_t row_bytes, const void* x, float* out) {
  dot_signed_blocks_x4<kQ4_0Bytes, 8>(
      n, w, row_bytes, static_cast<const BlockQ8_0*>(x),
      [](const uint8_t* block) { return nibbles_32(block + 2); }, Fp16Scale(), out);
}

// A row of Q4_0 blocks in the int8 GEMM's form: signed codes q - 8.
void int8_unpack_row_q4_0(const uint8_t* src, void* dst, int64_t n) {
  unpack_blocks<kQ4_0Bytes>(
      src, dst, n, [](const uint8_t* block) { return q4_0_codes(block); }, Fp16Scale(), NoMin());
}

}  // namespace block32
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
