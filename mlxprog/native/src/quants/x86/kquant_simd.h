// x86 helpers the K-quant and IQ4_XS kernels share (AVX2; VNNI's int16 dot
// product where the including table is compiled with it). Needs simd.h,
// which every x86 table includes first.
//
// The helpers are always inlined and the fixed loops over a block's vectors
// unrolled (#pragma GCC unroll): the unpacked codes then stay in registers
// and the shuffle masks become constants loaded once per row. Integer sums
// alternate between two accumulators, as VNNI's vpdpwssd has a latency of
// several cycles.
#pragma once

#include "../portable/kquant_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace kquant {

// acc + the sums of each two adjacent int16 products a[i] * b[i] as eight
// int32: one vpdpwssd with VNNI, vpmaddwd and an add otherwise.
[[gnu::always_inline]] inline __m256i madd_add_epi16(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

// 32 bytes at p.
[[gnu::always_inline]] inline __m256i load_256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// The fp16 at p as float (F16C: exact, subnormals included).
[[gnu::always_inline]] inline float fp16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// A pshufb mask that, on a vector whose two lanes both hold the same eight
// int16 scales, broadcasts scale 2s over the low lane and scale 2s + 1 over
// the high lane: the scales of the two 16-element halves of 32 codes.
[[gnu::always_inline]] inline __m256i scale_pair_mask(int s) {
  const int low = 4 * s, high = 4 * s + 2;
  return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>((high + 1) << 8 | high)),
                          _mm_set1_epi16(static_cast<int16_t>((low + 1) << 8 | low)));
}

// A pshufb mask broadcasting int16 number k (0..7) of each lane over it.
[[gnu::always_inline]] inline __m256i scale_mask(int k) {
  return _mm256_set1_epi16(static_cast<int16_t>((2 * k + 1) << 8 | 2 * k));
}

// v itself, opaque to the compiler: products stay rounded to float before a
// subtraction (no FMA contraction, which gguf's numpy does not do).
[[gnu::always_inline]] inline __m256 rounded_ps(__m256 v) {
  __asm__("" : "+x"(v));
  return v;
}

// The 32 int8 codes (in element order) as four vectors of eight floats.
struct Floats32 {
  __m256 v[4];
};
[[gnu::always_inline]] inline Floats32 codes_to_floats(__m256i codes) {
  const __m128i first = _mm256_castsi256_si128(codes), second = _mm256_extracti128_si256(codes, 1);
  return {{_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(first)),
           _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(first, first))),
           _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(second)),
           _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(second, second)))}};
}

// y[0..32) = scale * codes, scale_first for the first 16 and scale_second
// for the last 16 (one float rounding each, as gguf).
[[gnu::always_inline]] inline void store_scaled(float* y, __m256i codes, float scale_first,
                                                float scale_second) {
  const Floats32 f = codes_to_floats(codes);
  const __m256 first = _mm256_set1_ps(scale_first), second = _mm256_set1_ps(scale_second);
  _mm256_storeu_ps(y, _mm256_mul_ps(first, f.v[0]));
  _mm256_storeu_ps(y + 8, _mm256_mul_ps(first, f.v[1]));
  _mm256_storeu_ps(y + 16, _mm256_mul_ps(second, f.v[2]));
  _mm256_storeu_ps(y + 24, _mm256_mul_ps(second, f.v[3]));
}

// y[0..32) = scale * codes - offset, the product rounded first (gguf's
// order), with the scale and offset of each 16 as store_scaled.
[[gnu::always_inline]] inline void store_scaled_minus(float* y, __m256i codes, float scale_first,
                                                      float scale_second, float offset_first,
                                                      float offset_second) {
  const Floats32 f = codes_to_floats(codes);
  const __m256 scales[2] = {_mm256_set1_ps(scale_first), _mm256_set1_ps(scale_second)};
  const __m256 offsets[2] = {_mm256_set1_ps(offset_first), _mm256_set1_ps(offset_second)};
#pragma GCC unroll 16
  for (int k = 0; k < 4; ++k)
    _mm256_storeu_ps(
        y + 8 * k, _mm256_sub_ps(rounded_ps(_mm256_mul_ps(scales[k / 2], f.v[k])), offsets[k / 2]));
}

// The 16 int16 sums of each 16 q8 codes, paired into eight int16 sums of
// each 32 (they fit: 32 * 127 < 2^15).
[[gnu::always_inline]] inline __m128i q8k_sums_32(const BlockQ8_K& x) {
  const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.bsums));
  const __m128i second = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.bsums + 8));
  return _mm_hadd_epi16(first, second);
}

// sum over a block of scale * (codes . q8) as eight int32, for the types
// with a scale per 16 (scales: their 16 int16). codes_of(half, codes)
// writes the codes of elements 128 * half + 32k.. as codes[k], k < 4
// (unsigned, below 64, so the int16 pair sums cannot saturate); taking them
// half a block at a time keeps them in registers.
template <typename CodesOfHalf>
[[gnu::always_inline]] inline __m256i scaled_dot_16(__m256i scales, CodesOfHalf codes_of,
                                                    const int8_t* q8) {
  const __m256i halves[2] = {_mm256_permute2x128_si256(scales, scales, 0x00),
                             _mm256_permute2x128_si256(scales, scales, 0x11)};
  __m256i dot[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 16
  for (int half = 0; half < 2; ++half) {
    __m256i codes[4];
    codes_of(half, codes);
#pragma GCC unroll 16
    for (int k = 0; k < 4; ++k) {
      const __m256i pairs = _mm256_maddubs_epi16(codes[k], load_256(q8 + 128 * half + 32 * k));
      dot[k % 2] =
          madd_add_epi16(dot[k % 2], pairs, _mm256_shuffle_epi8(halves[half], scale_pair_mask(k)));
    }
  }
  return _mm256_add_epi32(dot[0], dot[1]);
}

// Writes a block of values scale * code, scales[j] the float scale of
// elements 16j..16j+15 and codes_of(half, codes) the int8 codes as for
// scaled_dot_16.
template <typename CodesOfHalf>
[[gnu::always_inline]] inline void write_scaled_16(const float scales[16], CodesOfHalf codes_of,
                                                   float* y) {
#pragma GCC unroll 16
  for (int half = 0; half < 2; ++half) {
    __m256i codes[4];
    codes_of(half, codes);
#pragma GCC unroll 16
    for (int k = 0; k < 4; ++k) {
      const int group = 4 * half + k;
      store_scaled(y + 32 * group, codes[k], scales[2 * group], scales[2 * group + 1]);
    }
  }
}

// The sum of a vector's four floats.
[[gnu::always_inline]] inline float hsum_128(__m128 v) {
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  v = _mm_add_ss(v, _mm_movehdup_ps(v));
  return _mm_cvtss_f32(v);
}

}  // namespace kquant
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
