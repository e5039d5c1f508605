// x86 Q3_K (AVX2): per 256, an fp16 d; per 16, a 6-bit signed scale; 3-bit
// codes q in -4..3. w = (d * scale) * q.
#pragma once

#include "kquant_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The codes + 4 (0..7) of elements 128 * half + 32s.. of a Q3_K block as
// codes[s]: two bits from qs as Q2_K lays them out, the third (4) from bit
// 4 * half + s of each byte of hmask.
[[gnu::always_inline]] inline void q3_k_codes(const kquant::Q3K& b, int half, __m256i codes[4]) {
  const __m256i low2 = _mm256_set1_epi8(3), bit2 = _mm256_set1_epi8(4);
  const __m256i q = kquant::load_256(b.qs + 32 * half);
  // Each byte's bit for group s, moved down to bit 0 (bits from the next
  // byte that shift in stay above bit 0 for the four groups).
  __m256i high = _mm256_srli_epi16(kquant::load_256(b.hmask), 4 * half);
#pragma GCC unroll 16
  for (int s = 0; s < 4; ++s) {
    codes[s] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * s), low2),
                               _mm256_and_si256(_mm256_slli_epi16(high, 2), bit2));
    high = _mm256_srli_epi16(high, 1);
  }
}

// A Q3_K block's 16 scales (-32..31) as int16.
[[gnu::always_inline]] inline __m256i q3_k_scales_epi16(const uint8_t* packed) {
  uint32_t words[4];
  kquant::q3_k_scale_words(packed, words);
  const __m128i raw = _mm_set_epi32(static_cast<int>(words[3]), static_cast<int>(words[2]),
                                    static_cast<int>(words[1]), static_cast<int>(words[0]));
  return _mm256_sub_epi16(_mm256_cvtepu8_epi16(raw), _mm256_set1_epi16(32));
}

// A row of Q3_K blocks to float32, as gguf computes it.
void dequantize_row_q3_k(const uint8_t* src, float* y, int64_t n) {
  const kquant::Q3K* blocks = reinterpret_cast<const kquant::Q3K*>(src);
  const __m256i offset = _mm256_set1_epi8(4);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    const float d = kquant::fp16_at(blocks[i].d);
    int8_t raw_scales[16];
    kquant::q3_k_scales(blocks[i].scales, raw_scales);
    float scales[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) scales[j] = d * static_cast<float>(raw_scales[j]);
    kquant::write_scaled_16(
        scales,
        [&](int half, __m256i* codes) {
          q3_k_codes(blocks[i], half, codes);
#pragma GCC unroll 16
          for (int s = 0; s < 4; ++s) codes[s] = _mm256_sub_epi8(codes[s], offset);
        },
        y);
  }
}

// Q3_K row . q8_K row: per block sum scale * ((q + 4) . q8) - 4 * sum scale
// * (the q8 sums of its 16), one float multiply-add by d_w * d_x.
float vec_dot_q3_k(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::Q3K* blocks = reinterpret_cast<const kquant::Q3K*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    const __m256i scales = q3_k_scales_epi16(blocks[i].scales);
    const __m256i offset_dot = _mm256_madd_epi16(scales, kquant::load_256(x[i].bsums));
    const __m256i dot = kquant::scaled_dot_16(
        scales, [&](int half, __m256i* codes) { q3_k_codes(blocks[i], half, codes); }, x[i].qs);
    acc = _mm256_fmadd_ps(
        _mm256_set1_ps(x[i].d * kquant::fp16_at(blocks[i].d)),
        _mm256_cvtepi32_ps(_mm256_sub_epi32(dot, _mm256_slli_epi32(offset_dot, 2))), acc);
  }
  return hsum_ps(acc);
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
