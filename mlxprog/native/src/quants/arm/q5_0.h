// arm Q5_0 (see portable/q5_0.h): codes q - 16 as signed bytes.
#pragma once

#include "block32.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace block32 {

// A Q5_0 block's 32 codes minus 16: the low nibble with 0xF0 set where the
// fifth bit is clear (nibble - 16 in two's complement).
inline Codes32 q5_0_codes(const uint8_t* block) {
  return or_where_bits<false>(nibbles_32(block + 6), block + 2, 0xF0);
}

// A row of Q5_0 blocks to float32, as gguf computes it.
void dequantize_row_q5_0(const uint8_t* src, float* y, int64_t n) {
  dequantize_blocks<kQ5_0Bytes>(src, y, n, q5_0_codes, fp16_scale);
}

// Q5_0 row . q8_0 row.
float vec_dot_q5_0(int64_t n, const uint8_t* w, const void* x) {
  return dot_blocks_q8_0<kQ5_0Bytes>(n, w, static_cast<const BlockQ8_0*>(x), q5_0_codes,
                                     fp16_scale);
}

}  // namespace block32
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
