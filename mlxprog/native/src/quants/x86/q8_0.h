// x86 Q8_0 (see portable/q8_0.h): the codes are the block's bytes.
#pragma once

#include "block32.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace block32 {

// A Q8_0 block's 32 signed codes.
inline __m256i q8_0_codes(const uint8_t* block) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
}

// A row of Q8_0 blocks to float32, as gguf computes it.
void dequantize_row_q8_0(const uint8_t* src, float* y, int64_t n) {
  dequantize_blocks<kQ8_0Bytes>(src, y, n, q8_0_codes, fp16_scale);
}

// Q8_0 row . q8_0 row.
float vec_dot_q8_0(int64_t n, const uint8_t* w, const void* x) {
  return dot_signed_blocks<kQ8_0Bytes>(n, w, static_cast<const BlockQ8_0*>(x), q8_0_codes,
                                       fp16_scale);
}

// A row of Q8_0 blocks in the int8 GEMM's form: its signed codes.
void int8_unpack_row_q8_0(const uint8_t* src, void* dst, int64_t n) {
  unpack_blocks<kQ8_0Bytes>(
      src, dst, n, [](const uint8_t* block) { return q8_0_codes(block); }, Fp16Scale(), NoMin());
}

}  // namespace block32
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
