// x86 Q5_0 (see portable/q5_0.h): codes q - 16 as signed bytes.
#pragma once

#include "block32.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace block32 {

// A Q5_0 block's 32 codes minus 16, as signed bytes: the low nibble with
// 0xF0 set where the fifth bit is clear (nibble - 16 in two's complement).
inline __m256i q5_0_codes(const uint8_t* block) {
  return or_where_bits<false>(nibbles_32(block + 6), block + 2, -16);
}

// A row of Q5_0 blocks to float32, as gguf computes it.
void dequantize_row_q5_0(const uint8_t* src, float* y, int64_t n) {
  dequantize_blocks<kQ5_0Bytes>(src, y, n, q5_0_codes, fp16_scale);
}

// Q5_0 row . q8_0 row.
float vec_dot_q5_0(int64_t n, const uint8_t* w, const void* x) {
  return dot_signed_blocks<kQ5_0Bytes>(n, w, static_cast<const BlockQ8_0*>(x), q5_0_codes,
                                       fp16_scale);
}

// Four Q5_0 rows . one q8_0 row: the 5-bit codes unsigned, offset 16 (see
// dot_signed_blocks_x4).
void vec_dot_4_q5_0(int64_t n, const uint8_t* w, int64_t row_bytes, const void* x, float* out) {
  dot_signed_blocks_x4<kQ5_0Bytes, 16>(
      n, w, row_bytes, static_cast<const BlockQ8_0*>(x),
      [](const uint8_t* block) {
        return or_where_bits<true>(nibbles_32(block + 6), block + 2, 16);
      },
      Fp16Scale(), out);
}

// A row of Q5_0 blocks in the int8 GEMM's form: signed codes q - 16.
void int8_unpack_row_q5_0(const uint8_t* src, void* dst, int64_t n) {
  unpack_blocks<kQ5_0Bytes>(
      src, dst, n, [](const uint8_t* block) { return q5_0_codes(block); }, Fp16Scale(), NoMin());
}

}  // namespace block32
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
