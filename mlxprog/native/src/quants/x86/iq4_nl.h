// x86 IQ4_NL (see portable/iq4_nl.h): the 4-bit indices looked up in the
// value table with one byte shuffle.
#pragma once

#include "block32.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace block32 {

// An IQ4_NL block's 32 table values, as signed bytes.
inline __m256i iq4_nl_codes(const uint8_t* block) {
  return _mm256_shuffle_epi8(byte_table_16(kIq4Levels), nibbles_32(block + 2));
}

// A row of IQ4_NL blocks to float32, as gguf computes it.
void dequantize_row_iq4_nl(const uint8_t* src, float* y, int64_t n) {
  dequantize_blocks<kIq4nlBytes>(src, y, n, iq4_nl_codes, fp16_scale);
}

// IQ4_NL row . q8_0 row.
float vec_dot_iq4_nl(int64_t n, const uint8_t* w, const void* x) {
  return dot_signed_blocks<kIq4nlBytes>(n, w, static_cast<const BlockQ8_0*>(x), iq4_nl_codes,
                                        fp16_scale);
}

// Four IQ4_NL rows . one q8_0 row (see dot_signed_blocks_x4).
void vec_dot_4_iq4_nl(int64_t n, const uint8_t* w, int64_t row_bytes, const void* x,
                      float* out) {
  dot_signed_blocks_x4<kIq4nlBytes, 0>(
      n, w, row_bytes, static_cast<const BlockQ8_0*>(x),
      [](const uint8_t* block) { return iq4_nl_codes(block); }, Fp16Scale(), out);
}

// A row of IQ4_NL blocks in the int8 GEMM's form: the table values.
void int8_unpack_row_iq4_nl(const uint8_t* src, void* dst, int64_t n) {
  unpack_blocks<kIq4nlBytes>(
      src, dst, n, [](const uint8_t* block) { return iq4_nl_codes(block); }, Fp16Scale(),
      NoMin());
}

}  // namespace block32
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
