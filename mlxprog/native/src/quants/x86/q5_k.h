// x86 Q5_K (AVX2): Q4_K's scales, mins and 4-bit codes with a fifth bit per
// code from qh; w = (d * scale) * q - dmin * min. Q4_K's block kernels
// (q4_k.h) do the rest.
#pragma once

#include "q4_k.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The 5-bit codes of sub-blocks 4 * half + k of a Q5_K block as codes[k]:
// Q4_K's nibbles, plus 16 where bit 4 * half + k of qh[l] is set (element
// l of the sub-block).
[[gnu::always_inline]] inline void q5_k_codes(const kquant::Q5K& b, int half, __m256i codes[4]) {
  q4_k_codes(b.qs, half, codes);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  // Each byte's bit for sub-block k, moved down to bit 0 (bits from the next
  // byte that shift in stay above bit 0 for the four sub-blocks).
  __m256i high = _mm256_srli_epi16(kquant::load_256(b.qh), 4 * half);
#pragma GCC unroll 16
  for (int k = 0; k < 4; ++k) {
    codes[k] = _mm256_or_si256(codes[k], _mm256_and_si256(_mm256_slli_epi16(high, 4), bit4));
    high = _mm256_srli_epi16(high, 1);
  }
}

// A row of Q5_K blocks to float32, as gguf computes it.
void dequantize_row_q5_k(const uint8_t* src, float* y, int64_t n) {
  const kquant::Q5K* blocks = reinterpret_cast<const kquant::Q5K*>(src);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    const kquant::Q5K& b = blocks[i];
    q4_k_write_block(
        b.d, b.dmin, b.scales, [&](int half, __m256i* codes) { q5_k_codes(b, half, codes); }, y);
  }
}

// Q5_K row . q8_K row (the portable kernel's sums, in vector lanes).
float vec_dot_q5_k(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::Q5K* blocks = reinterpret_cast<const kquant::Q5K*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_min = _mm_setzero_ps();
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    const kquant::Q5K& b = blocks[i];
    q4_k_block_dot(
        b.d, b.dmin, b.scales, [&](int half, __m256i* codes) { q5_k_codes(b, half, codes); }, x[i],
        acc, acc_min);
  }
  return hsum_ps(acc) - kquant::hsum_128(acc_min);
}

// A row of Q5_K blocks in the int8 GEMM's form: codes 0..31.
void int8_unpack_row_q5_k(const uint8_t* src, void* dst, int64_t n) {
  const kquant::Q5K* blocks = reinterpret_cast<const kquant::Q5K*>(src);
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    const kquant::Q5K& b = blocks[i];
    q4_k_unpack_block(
        b.d, b.dmin, b.scales, [&](int half, __m256i* codes) { q5_k_codes(b, half, codes); },
        out[i]);
  }
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
