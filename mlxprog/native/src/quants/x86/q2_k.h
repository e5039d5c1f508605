// x86 Q2_K (AVX2): per 256, fp16 d and dmin; per 16, a 4-bit scale and a
// 4-bit min; 2-bit codes q. w = (d * scale) * q - dmin * min.
#pragma once

#include "kquant_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The 2-bit codes of elements 128 * half + 32s.. of a Q2_K block as
// codes[s]: bits 2s..2s+1 of the half's 32 bytes of qs.
[[gnu::always_inline]] inline void q2_k_codes(const kquant::Q2K& b, int half, __m256i codes[4]) {
  const __m256i low2 = _mm256_set1_epi8(3);
  const __m256i q = kquant::load_256(b.qs + 32 * half);
#pragma GCC unroll 16
  for (int s = 0; s < 4; ++s) codes[s] = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), low2);
}

// A row of Q2_K blocks to float32, as gguf computes it.
void dequantize_row_q2_k(const uint8_t* src, float* y, int64_t n) {
  const kquant::Q2K* blocks = reinterpret_cast<const kquant::Q2K*>(src);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    const kquant::Q2K& b = blocks[i];
    const float d = kquant::fp16_at(b.d), dmin = kquant::fp16_at(b.dmin);
#pragma GCC unroll 16
    for (int half = 0; half < 2; ++half) {
      __m256i codes[4];
      q2_k_codes(b, half, codes);
#pragma GCC unroll 16
      for (int s = 0; s < 4; ++s) {
        const int group = 4 * half + s;
        const uint8_t first = b.scales[2 * group], second = b.scales[2 * group + 1];
        kquant::store_scaled_minus(y + 32 * group, codes[s], d * static_cast<float>(first & 0x0F),
                                   d * static_cast<float>(second & 0x0F),
                                   dmin * static_cast<float>(first >> 4),
                                   dmin * static_cast<float>(second >> 4));
      }
    }
  }
}

// Q2_K row . q8_K row: per block d_w * d_x * sum scale * (q . q8) minus
// dmin_w * d_x * sum min * (the q8 sums of its 16).
float vec_dot_q2_k(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::Q2K* blocks = reinterpret_cast<const kquant::Q2K*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[i].scales));
    const __m256i scales = _mm256_cvtepu8_epi16(_mm_and_si128(packed, low4));
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), low4));
    const __m256i min_dot = _mm256_madd_epi16(mins, kquant::load_256(x[i].bsums));
    const __m256i dot = kquant::scaled_dot_16(
        scales, [&](int half, __m256i* codes) { q2_k_codes(blocks[i], half, codes); }, x[i].qs);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * kquant::fp16_at(blocks[i].d)),
                          _mm256_cvtepi32_ps(dot), acc);
    acc = _mm256_fnmadd_ps(_mm256_set1_ps(x[i].d * kquant::fp16_at(blocks[i].dmin)),
                           _mm256_cvtepi32_ps(min_dot), acc);
  }
  return hsum_ps(acc);
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
