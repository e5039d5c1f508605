// x86 (AVX2+FMA): the vector helpers the x86 families share (horizontal sum,
// byte widening, exp on non-positive inputs) and the x86 Vec, the AVX2 row
// load and dot product that family code takes as its `Vec` parameter (see
// portable/vec.h). Included only by the x86-64 tables, which are compiled
// with -mavx2 -mfma -mf16c.
#pragma once

#include <immintrin.h>

#include <cstring>

#include "kernels/portable/vec.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace x86 {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 u8x8_to_ps(__m128i bytes) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

// exp(x) for x <= 0 (softmax after subtracting the maximum), to a few ulp:
// x = n ln2 + r with |r| <= ln2 / 2, exp(r) by a Cephes-style polynomial,
// times 2^n built in the exponent bits; below -87.3 the result is 0.
inline __m256 exp_nonpositive(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.3f);
  const __m256 keep = _mm256_cmp_ps(x, lowest, _CMP_GE_OQ);
  x = _mm256_max_ps(x, lowest);
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n ln2, in two parts for accuracy
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 poly = _mm256_set1_ps(1.9875691500e-4f);
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.3981999507e-3f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(8.3334519073e-3f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(4.1665795894e-2f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.6666665459e-1f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(5.0000001201e-1f));
  poly = _mm256_fmadd_ps(poly, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i power = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(poly, _mm256_castsi256_ps(power)), keep);
}

struct Vec {
  // As portable::Vec::load_row, converting eight halves (F16C) or bfloat16s
  // (a shift into the high half) at a time.
  static void load_row(const void* p, DType t, int64_t offset, int64_t n, float* dst);

  // a . b over n floats: two FMA chains over 16 floats a step.
  static float dot(const float* a, const float* b, int64_t n);
};

void Vec::load_row(const void* p, DType t, int64_t offset, int64_t n, float* dst) {
  if (t == DType::f32) {
    std::memcpy(dst, static_cast<const float*>(p) + offset, n * sizeof(float));
    return;
  }
  const uint16_t* src = static_cast<const uint16_t*>(p) + offset;
  int64_t i = 0;
  if (t == DType::f16) {
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  } else {
    for (; i + 8 <= n; i += 8) {
      __m256i wide = _mm256_cvtepu16_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
    }
  }
  for (; i < n; ++i)
    dst[i] = t == DType::f16 ? half_to_float(src[i]) : bf16_to_float(src[i]);
}

float Vec::dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float total = 0.f;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8)
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  total = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

}  // namespace x86
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
