// x86 MXFP4 (see portable/mxfp4.h): the E2M1 codes looked up (doubled) with
// one byte shuffle, times half the E8M0 scale.
#pragma once

#include "block32.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace block32 {

// An MXFP4 block's 32 doubled E2M1 values, as signed bytes.
inline __m256i mxfp4_codes(const uint8_t* block) {
  return _mm256_shuffle_epi8(byte_table_16(kMxfp4DoubledValues), nibbles_32(block + 1));
}

// Half an MXFP4 block's scale (its codes are doubled).
inline float mxfp4_scale(const uint8_t* block) { return e8m0_half_scale(block[0]); }

// A row of MXFP4 blocks to float32, as gguf computes it.
void dequantize_row_mxfp4(const uint8_t* src, float* y, int64_t n) {
  dequantize_blocks<kMxfp4Bytes>(src, y, n, mxfp4_codes, mxfp4_scale);
}

// MXFP4 row . q8_0 row.
float vec_dot_mxfp4(int64_t n, const uint8_t* w, const void* x) {
  return dot_signed_blocks<kMxfp4Bytes>(n, w, static_cast<const BlockQ8_0*>(x), mxfp4_codes,
                                        mxfp4_scale);
}

// Four MXFP4 rows . one q8_0 row (see dot_signed_blocks_x4).
void vec_dot_4_mxfp4(int64_t n, const uint8_t* w, int64_t row_bytes, const void* x, float* out) {
  dot_signed_blocks_x4<kMxfp4Bytes, 0>(
      n, w, row_bytes, static_cast<const BlockQ8_0*>(x),
      [](const uint8_t* block) { return mxfp4_codes(block); },
      [](const uint8_t* block) { return mxfp4_scale(block); }, out);
}

// A row of MXFP4 blocks in the int8 GEMM's form: the doubled E2M1 values
// and the half scale.
void int8_unpack_row_mxfp4(const uint8_t* src, void* dst, int64_t n) {
  unpack_blocks<kMxfp4Bytes>(
      src, dst, n, [](const uint8_t* block) { return mxfp4_codes(block); },
      [](const uint8_t* block) { return mxfp4_scale(block); }, NoMin());
}

}  // namespace block32
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
