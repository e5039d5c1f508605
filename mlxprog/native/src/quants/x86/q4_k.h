// x86 Q4_K (AVX2): per 256, fp16 d and dmin; per 32, a 6-bit scale and a
// 6-bit min; 4-bit codes q. w = (d * scale) * q - dmin * min.
// Its block kernels are shared with Q5_K (same scales, one more code bit).
#pragma once

#include "kquant_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A Q4_K/Q5_K block's scales and mins as 16 int16: the eight scales in the
// low lane, the eight mins in the high lane.
[[gnu::always_inline]] inline __m256i q4_k_scales_mins_epi16(const uint8_t* packed) {
  uint32_t words[4];
  kquant::q4_k_scale_words(packed, words);
  return _mm256_cvtepu8_epi16(_mm_set_epi32(static_cast<int>(words[3]), static_cast<int>(words[2]),
                                            static_cast<int>(words[1]),
                                            static_cast<int>(words[0])));
}

// The 4-bit codes of sub-blocks 4 * half + k of a Q4_K/Q5_K block as
// codes[k] (each 32 bytes of qs hold one sub-block in their low nibbles,
// the next in their high nibbles).
[[gnu::always_inline]] inline void q4_k_codes(const uint8_t* qs, int half, __m256i codes[4]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 16
  for (int chunk = 0; chunk < 2; ++chunk) {
    const __m256i q = kquant::load_256(qs + 64 * half + 32 * chunk);
    codes[2 * chunk] = _mm256_and_si256(q, low4);
    codes[2 * chunk + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
  }
}

// One Q4_K/Q5_K block against its q8_K block, codes_of(half, codes) giving
// the codes of sub-blocks 4 * half + k as codes[k]: acc += d_w * d_x * sum
// scale * (q . q8) (eight lanes to add up at the end) and acc_min += dmin_w
// * d_x * sum min * (the q8 sums of its 32) (four lanes).
template <typename CodesOfHalf>
[[gnu::always_inline]] inline void q4_k_block_dot(const uint8_t* d, const uint8_t* dmin,
                                                  const uint8_t* packed_scales,
                                                  CodesOfHalf codes_of, const BlockQ8_K& x,
                                                  __m256& acc, __m128& acc_min) {
  const __m256i scales_mins = q4_k_scales_mins_epi16(packed_scales);
  const __m128i min_dot =
      _mm_madd_epi16(_mm256_extracti128_si256(scales_mins, 1), kquant::q8k_sums_32(x));
  acc_min =
      _mm_fmadd_ps(_mm_set1_ps(x.d * kquant::fp16_at(dmin)), _mm_cvtepi32_ps(min_dot), acc_min);
  const __m256i scales = _mm256_permute2x128_si256(scales_mins, scales_mins, 0x00);
  __m256i dot[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 16
  for (int half = 0; half < 2; ++half) {
    __m256i codes[4];
    codes_of(half, codes);
#pragma GCC unroll 16
    for (int k = 0; k < 4; ++k) {
      const int sub = 4 * half + k;
      // Codes below 32 against q8 codes: the int16 pair sums cannot saturate.
      const __m256i pairs = _mm256_maddubs_epi16(codes[k], kquant::load_256(x.qs + 32 * sub));
      dot[k % 2] = kquant::madd_add_epi16(dot[k % 2], pairs,
                                          _mm256_shuffle_epi8(scales, kquant::scale_mask(sub)));
    }
  }
  acc = _mm256_fmadd_ps(_mm256_set1_ps(x.d * kquant::fp16_at(d)),
                        _mm256_cvtepi32_ps(_mm256_add_epi32(dot[0], dot[1])), acc);
}

// Writes one Q4_K/Q5_K block's values, as gguf computes them ((d * scale)
// * q rounded, then - dmin * min), codes_of as for q4_k_block_dot.
template <typename CodesOfHalf>
[[gnu::always_inline]] inline void q4_k_write_block(const uint8_t* d16, const uint8_t* dmin16,
                                                    const uint8_t* packed_scales,
                                                    CodesOfHalf codes_of, float* y) {
  const float d = kquant::fp16_at(d16), dmin = kquant::fp16_at(dmin16);
  uint8_t scales_mins[16];
  kquant::q4_k_scales_mins(packed_scales, scales_mins);
#pragma GCC unroll 16
  for (int half = 0; half < 2; ++half) {
    __m256i codes[4];
    codes_of(half, codes);
#pragma GCC unroll 16
    for (int k = 0; k < 4; ++k) {
      const int sub = 4 * half + k;
      const float scale = d * static_cast<float>(scales_mins[sub]);
      const float offset = dmin * static_cast<float>(scales_mins[8 + sub]);
      kquant::store_scaled_minus(y + 32 * sub, codes[k], scale, scale, offset, offset);
    }
  }
}

// One Q4_K/Q5_K block in the int8 GEMM's form, codes_of as for
// q4_k_block_dot: a vector store per 32 codes (the portable unpacker's
// bytes), the portable scales and mins.
template <typename CodesOfHalf>
[[gnu::always_inline]] inline void q4_k_unpack_block(const uint8_t* d, const uint8_t* dmin,
                                                     const uint8_t* packed_scales,
                                                     CodesOfHalf codes_of, Int8BlockK& out) {
#pragma GCC unroll 16
  for (int half = 0; half < 2; ++half) {
    __m256i codes[4];
    codes_of(half, codes);
#pragma GCC unroll 16
    for (int k = 0; k < 4; ++k)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.codes + 128 * half + 32 * k), codes[k]);
  }
  kquant::set_q4_k_int8_groups(packed_scales, kquant::fp16_at(d), kquant::fp16_at(dmin), out);
}

// A row of Q4_K blocks to float32, as gguf computes it.
void dequantize_row_q4_k(const uint8_t* src, float* y, int64_t n) {
  const kquant::Q4K* blocks = reinterpret_cast<const kquant::Q4K*>(src);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    const kquant::Q4K& b = blocks[i];
    q4_k_write_block(
        b.d, b.dmin, b.scales, [&](int half, __m256i* codes) { q4_k_codes(b.qs, half, codes); }, y);
  }
}

// Q4_K row . q8_K row (the portable kernel's sums, in vector lanes).
float vec_dot_q4_k(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::Q4K* blocks = reinterpret_cast<const kquant::Q4K*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_min = _mm_setzero_ps();
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    const kquant::Q4K& b = blocks[i];
    q4_k_block_dot(
        b.d, b.dmin, b.scales, [&](int half, __m256i* codes) { q4_k_codes(b.qs, half, codes); },
        x[i], acc, acc_min);
  }
  return hsum_ps(acc) - kquant::hsum_128(acc_min);
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
