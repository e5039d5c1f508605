// x86: the activation quantizers (float32 -> q8_0, q8_1, q8_K blocks) and
// the float32 dot product, AVX2 + FMA. q8_0 and q8_1 are ggml-cpu's AVX2
// quantizers' numbers (scale 127 / amax, codes rounded half to even: on an
// exact tie a code may differ by one from the portable table's, which
// rounds half away from zero as llama.cpp's reference does); q8_K equals
// the portable table's (llama.cpp's quantize_row_q8_K_ref) bit for bit.
#pragma once

#include "../common.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
// Names live in the nested namespace `activations`: other groups' helpers
// share the enclosing namespace in the same table file.
namespace activations {

// The largest of a vector's eight floats.
inline float hmax_ps(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// |v| of eight floats.
inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

// f rounded to the nearest fp16 (ties to even) and back (F16C).
inline float round_fp16_f16c(float f) { return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }

// 32 floats times `scale`, rounded half to even, as int32 (four vectors of
// eight: elements 0-7, 8-15, 16-23, 24-31).
inline void scaled_codes_32(const float* x, __m256 scale, __m256i codes[4]) {
  for (int k = 0; k < 4; ++k)
    codes[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), scale));
}

// Four vectors of eight int32 (within +-127) stored as 32 int8 in order.
inline void store_codes_32(const __m256i codes[4], int8_t* qs) {
  // The packs work per 128-bit lane: the bytes come out as dwords
  // 0, 2, 4, 6, 1, 3, 5, 7 of the wanted order.
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(codes[0], codes[1]),
                                            _mm256_packs_epi32(codes[2], codes[3]));
  const __m256i ordered =
      _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), ordered);
}

// The largest |x[j]| of 32 floats.
inline float max_abs_32(const float* x) {
  __m256 m = abs_ps(_mm256_loadu_ps(x));
  for (int k = 1; k < 4; ++k) m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + 8 * k)));
  return hmax_ps(m);
}

// n floats to q8_0 blocks: d = amax / 127 (kept fp16-rounded), codes
// x * (127 / amax) rounded half to even.
void quantize_q8_0(const float* x, void* dst, int64_t n) {
  BlockQ8_0* y = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / 32; ++i, x += 32) {
    const float amax = max_abs_32(x);
    y[i].d = round_fp16_f16c(amax / 127.0f);
    __m256i codes[4];
    scaled_codes_32(x, _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f), codes);
    store_codes_32(codes, y[i].qs);
  }
}

// n floats to q8_1 blocks: q8_0's d and codes, and s = d * sum(codes) (d
// before its fp16 rounding, s fp16-rounded).
void quantize_q8_1(const float* x, void* dst, int64_t n) {
  BlockQ8_1* y = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < n / 32; ++i, x += 32) {
    const float amax = max_abs_32(x), d = amax / 127.0f;
    __m256i codes[4];
    scaled_codes_32(x, _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f), codes);
    store_codes_32(codes, y[i].qs);
    const int sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(codes[0], codes[1]),
                                                _mm256_add_epi32(codes[2], codes[3])));
    y[i].d = round_fp16_f16c(d);
    y[i].s = round_fp16_f16c(static_cast<float>(sum) * d);
  }
}

// n floats to q8_K blocks of 256, as the portable quantize_q8_K: scale =
// -127 / peak (peak the first value of largest magnitude), codes
// nearest(scale * x) (half to even; never beyond +-127), d = 1 / scale, and
// the sums of each 16 codes.
void quantize_q8_K(const float* x, void* dst, int64_t n) {
  BlockQ8_K* y = static_cast<BlockQ8_K*>(dst);
  for (int64_t i = 0; i < n / 256; ++i, x += 256) {
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 32; ++k) m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + 8 * k)));
    const float amax = hmax_ps(m);
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    float peak = 0.0f;
    const __m256 target = _mm256_set1_ps(amax);
    for (int k = 0; k < 32; ++k) {
      const int hits =
          _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + 8 * k)), target, _CMP_EQ_OQ));
      if (hits) {
        peak = x[8 * k + __builtin_ctz(static_cast<unsigned>(hits))];
        break;
      }
    }
    const float scale = -127.0f / peak;
    for (int g = 0; g < 8; ++g) {
      __m256i codes[4];
      scaled_codes_32(x + 32 * g, _mm256_set1_ps(scale), codes);
      store_codes_32(codes, y[i].qs + 32 * g);
      y[i].bsums[2 * g] = static_cast<int16_t>(hsum_epi32(_mm256_add_epi32(codes[0], codes[1])));
      y[i].bsums[2 * g + 1] =
          static_cast<int16_t>(hsum_epi32(_mm256_add_epi32(codes[2], codes[3])));
    }
    y[i].d = 1.0f / scale;
  }
}

// sum_i a[i] * b[i]: four vectors of eight partial sums (FMA), then the
// remainder one by one.
float dot_f32(int64_t n, const float* a, const float* b) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k)
      acc[k] =
          _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * k), _mm256_loadu_ps(b + i + 8 * k), acc[k]);
  for (; i + 8 <= n; i += 8)
    acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc[0]);
  float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace activations
}  // namespace

// Registers the activation quantizers and the float32 dot product.
inline void add_activations(QuantKernels& k) {
  k.quantize_activation[static_cast<int>(Activation::q8_0)] = activations::quantize_q8_0;
  k.quantize_activation[static_cast<int>(Activation::q8_1)] = activations::quantize_q8_1;
  k.quantize_activation[static_cast<int>(Activation::q8_K)] = activations::quantize_q8_K;
  k.dot_f32 = activations::dot_f32;
}

}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
