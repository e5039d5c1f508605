// x86 Q6_K (AVX2): per 256, an fp16 d; per 16, an int8 scale; 6-bit codes
// q - 32. w = (d * scale) * (q - 32).
#pragma once

#include "kquant_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The unsigned 6-bit codes q (0..63) of elements 128 * half + 32s.. of a
// Q6_K block as codes[s]: the low or high nibbles of one of the half's two
// 32-byte runs of ql, with bits 2s..2s+1 of its 32 bytes of qh
// (portable/q6_k.h has the layout).
[[gnu::always_inline]] inline void q6_k_codes(const kquant::Q6K& b, int half, __m256i codes[4]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
  const __m256i ql0 = kquant::load_256(b.ql + 64 * half),
                ql1 = kquant::load_256(b.ql + 64 * half + 32);
  const __m256i qh = kquant::load_256(b.qh + 32 * half);
  codes[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4),
                             _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45));
  codes[1] = _mm256_or_si256(_mm256_and_si256(ql1, low4),
                             _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45));
  codes[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                             _mm256_and_si256(qh, bits45));
  codes[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                             _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45));
}

// A row of Q6_K blocks to float32, as gguf computes it.
void dequantize_row_q6_k(const uint8_t* src, float* y, int64_t n) {
  const kquant::Q6K* blocks = reinterpret_cast<const kquant::Q6K*>(src);
  const __m256i offset = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    const float d = kquant::fp16_at(blocks[i].d);
    float scales[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) scales[j] = d * static_cast<float>(blocks[i].scales[j]);
    kquant::write_scaled_16(
        scales,
        [&](int half, __m256i* codes) {
          q6_k_codes(blocks[i], half, codes);
#pragma GCC unroll 16
          for (int s = 0; s < 4; ++s) codes[s] = _mm256_sub_epi8(codes[s], offset);
        },
        y);
  }
}

// Q6_K row . q8_K row: per block sum scale * (q . q8) - 32 * sum scale *
// (the q8 sums of its 16), one float multiply-add by d_w * d_x.
float vec_dot_q6_k(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::Q6K* blocks = reinterpret_cast<const kquant::Q6K*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    const __m256i scales =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[i].scales)));
    const __m256i offset_dot = _mm256_madd_epi16(scales, kquant::load_256(x[i].bsums));
    const __m256i dot = kquant::scaled_dot_16(
        scales, [&](int half, __m256i* codes) { q6_k_codes(blocks[i], half, codes); }, x[i].qs);
    acc = _mm256_fmadd_ps(
        _mm256_set1_ps(x[i].d * kquant::fp16_at(blocks[i].d)),
        _mm256_cvtepi32_ps(_mm256_sub_epi32(dot, _mm256_slli_epi32(offset_dot, 5))), acc);
  }
  return hsum_ps(acc);
}

// A row of Q6_K blocks in the int8 GEMM's form, the portable unpacker's
// bytes: the unsigned codes q (0..63) by vector stores, the portable
// scales and mins.
void int8_unpack_row_q6_k(const uint8_t* src, void* dst, int64_t n) {
  const kquant::Q6K* blocks = reinterpret_cast<const kquant::Q6K*>(src);
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
#pragma GCC unroll 16
    for (int half = 0; half < 2; ++half) {
      __m256i codes[4];
      q6_k_codes(blocks[i], half, codes);
#pragma GCC unroll 16
      for (int s = 0; s < 4; ++s)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[i].codes + 128 * half + 32 * s),
                            codes[s]);
    }
    kquant::set_q6_k_int8_groups(blocks[i], kquant::fp16_at(blocks[i].d), out[i]);
  }
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
