// arm Q4_0 (see portable/q4_0.h): codes q - 8 as signed bytes.
#pragma once

#include "block32.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace block32 {

// A Q4_0 block's 32 codes minus 8.
inline Codes32 q4_0_codes(const uint8_t* block) {
  const Codes32 q = nibbles_32(block + 2);
  return {vsubq_s8(q.low, vdupq_n_s8(8)), vsubq_s8(q.high, vdupq_n_s8(8))};
}

// A row of Q4_0 blocks to float32, as gguf computes it.
void dequantize_row_q4_0(const uint8_t* src, float* y, int64_t n) {
  dequantize_blocks<kQ4_0Bytes>(src, y, n, q4_0_codes, fp16_scale);
}

// Q4_0 row . q8_0 row.
float vec_dot_q4_0(int64_t n, const uint8_t* w, const void* x) {
  return dot_blocks_q8_0<kQ4_0Bytes>(n, w, static_cast<const BlockQ8_0*>(x), q4_0_codes,
                                     fp16_scale);
}

}  // namespace block32
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
