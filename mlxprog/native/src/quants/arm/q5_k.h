// arm Q5_K (NEON + dotprod): Q4_K's scales, mins and 4-bit codes with a
// fifth bit per code from qh; w = (d * scale) * q - dmin * min. Q4_K's block
// kernels (q4_k.h) do the rest.
#pragma once

#include "q4_k.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The 5-bit codes of half a Q5_K block (kquant_neon.h's codes_of): Q4_K's
// nibbles, plus 16 where bit k of qh[l] is set (element l of sub-block k).
[[gnu::always_inline]] inline void q5_k_codes(const kquant::Q5K& b, int half, int8x16_t codes[8]) {
  q4_k_codes(b.qs, half, codes);
  const uint8x16_t bit4 = vdupq_n_u8(0x10);
#pragma GCC unroll 16
  for (int j = 0; j < 2; ++j) {
    const uint8x16_t bits = vld1q_u8(b.qh + 16 * j);
    uint8x16_t high = half ? vshrq_n_u8(bits, 4) : bits;  // sub-block k's bit, moved to bit 0
#pragma GCC unroll 16
    for (int k = 0; k < 4; ++k) {
      codes[2 * k + j] =
          vorrq_s8(codes[2 * k + j], kquant::as_s8(vandq_u8(vshlq_n_u8(high, 4), bit4)));
      high = vshrq_n_u8(high, 1);
    }
  }
}

// A row of Q5_K blocks to float32, as gguf computes it.
void dequantize_row_q5_k(const uint8_t* src, float* y, int64_t n) {
  const kquant::Q5K* blocks = reinterpret_cast<const kquant::Q5K*>(src);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    const kquant::Q5K& b = blocks[i];
    q4_k_write_block(
        b.d, b.dmin, b.scales, [&](int half, int8x16_t* codes) { q5_k_codes(b, half, codes); }, y);
  }
}

// Q5_K row . q8_K row (the portable kernel's sums, in vector lanes).
float vec_dot_q5_k(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::Q5K* blocks = reinterpret_cast<const kquant::Q5K*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float32x4_t acc = vdupq_n_f32(0.0f);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    const kquant::Q5K& b = blocks[i];
    acc = q4_k_block_dot(
        b.d, b.dmin, b.scales, [&](int half, int8x16_t* codes) { q5_k_codes(b, half, codes); },
        x[i], acc);
  }
  return vaddvq_f32(acc);
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
