// x86 (AVX2+FMA): attention's inner loops on 8-float vectors, which the
// algorithm in portable/attention.h runs with (portable::attention<
// x86::AttentionLoops> and its quantized twin). Each loop finishes the
// elements its vectors leave as portable::AttentionLoops does.
#pragma once

#include <immintrin.h>

#include <cstring>

#include "kernels/portable/attention.h"
#include "kernels/x86/vec.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace x86 {

struct AttentionLoops {
  static float mask_and_top(float* scores, int64_t n, const uint8_t* mask, bool& nan);

  static float softmax_numerators(float* scores, int64_t n, float top);

  // Eight vectors of output (64 floats) stay in registers across the rows.
  static void weighted_rows(const float* w, const float* rows, int64_t n, int64_t D, float* out,
                            bool accumulate = false);

  // Four keys at a time (one horizontal reduction for the four) where D is a
  // multiple of 8, the rest one by one.
  static void key_scores(const float* q, const float* keys, int64_t n, int64_t D, float scale,
                         float* dots);

  // key_scores of two queries: the four-key blocks both see load each key
  // once for the two, and each query's other keys go through key_scores
  // from the same multiple of four (so each dot is summed as key_scores
  // sums it).
  static void key_scores_pair(const float* q0, const float* q1, const float* keys, int64_t n0,
                              int64_t n1, int64_t D, float scale, float* dots0, float* dots1);

  // weighted_rows of two queries: 32 output floats of each in registers,
  // each row's vectors loaded once for the two (D a multiple of 64, else
  // one query at a time), then the second query's rows past the first's.
  static void weighted_rows_pair(const float* w0, const float* w1, const float* rows,
                                 int64_t n0, int64_t n1, int64_t D, float* out0, float* out1,
                                 bool accumulate);

  static void dequantize_rows(const QuantizedRows& c, int bits, int64_t group_size, int64_t D,
                              int64_t row0, int64_t n, float* out);
};

float AttentionLoops::mask_and_top(float* scores, int64_t n, const uint8_t* mask, bool& nan) {
  int64_t j = 0;
  const __m256 minus_inf = _mm256_set1_ps(-__builtin_inff());
  __m256 top8 = minus_inf, unordered = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    __m256 s = _mm256_loadu_ps(scores + j);
    if (mask) {
      int64_t bytes;
      std::memcpy(&bytes, mask + j, 8);
      const __m256i keep = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes));
      const __m256 masked =
          _mm256_castsi256_ps(_mm256_cmpeq_epi32(keep, _mm256_setzero_si256()));
      s = _mm256_blendv_ps(s, minus_inf, masked);
      _mm256_storeu_ps(scores + j, s);
    }
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(s, s, _CMP_UNORD_Q));
    // maxps returns its second operand where one is NaN: a NaN score leaves
    // the running top as the scalar loop does.
    top8 = _mm256_max_ps(s, top8);
  }
  nan |= _mm256_movemask_ps(unordered) != 0;
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, top8);
  float top = -__builtin_inff();
  for (float lane : lanes) top = lane > top ? lane : top;
  for (; j < n; ++j) {
    if (mask && !mask[j]) scores[j] = -__builtin_inff();
    nan |= scores[j] != scores[j];
    top = scores[j] > top ? scores[j] : top;
  }
  return top;
}

float AttentionLoops::softmax_numerators(float* scores, int64_t n, float top) {
  int64_t j = 0;
  float total = 0.f;
  const __m256 vtop = _mm256_set1_ps(top);
  __m256 sum = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(scores + j), vtop));
    _mm256_storeu_ps(scores + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  total = hsum(sum);
  for (; j < n; ++j) {
    const float e = scores[j] == -__builtin_inff() ? 0.f : __builtin_expf(scores[j] - top);
    scores[j] = e;
    total += e;
  }
  return total;
}

void AttentionLoops::weighted_rows(const float* w, const float* rows, int64_t n, int64_t D,
                                   float* out, bool accumulate) {
  int64_t d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) {
    __m256 acc[8];
    for (int u = 0; u < 8; ++u)
      acc[u] = accumulate ? _mm256_loadu_ps(out + d0 + 8 * u) : _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      if (w[j] == 0.f) continue;
      const __m256 wj = _mm256_set1_ps(w[j]);
      const float* r = rows + j * D + d0;
      for (int u = 0; u < 8; ++u) acc[u] = _mm256_fmadd_ps(wj, _mm256_loadu_ps(r + 8 * u), acc[u]);
    }
    for (int u = 0; u < 8; ++u) _mm256_storeu_ps(out + d0 + 8 * u, acc[u]);
  }
  for (; d0 < D; d0 += 64) {
    const int64_t width = portable::imin(64, D - d0);
    float acc[64];
    for (int64_t d = 0; d < width; ++d) acc[d] = accumulate ? out[d0 + d] : 0.f;
    for (int64_t j = 0; j < n; ++j) {
      if (w[j] == 0.f) continue;
      const float* r = rows + j * D + d0;
      for (int64_t d = 0; d < width; ++d) acc[d] += w[j] * r[d];
    }
    for (int64_t d = 0; d < width; ++d) out[d0 + d] = acc[d];
  }
}

// dots[0..4) = the horizontal sums of four keys' accumulators, times scale.
inline void store_key_sums(const __m256* acc, float scale, float* dots) {
  // [a0+a1.., b.., c.., d..] in one 128-bit vector
  const __m256 ab = _mm256_hadd_ps(acc[0], acc[1]), cd = _mm256_hadd_ps(acc[2], acc[3]);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  const __m128 sums = _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
  _mm_storeu_ps(dots, _mm_mul_ps(sums, _mm_set1_ps(scale)));
}

void AttentionLoops::key_scores(const float* q, const float* keys, int64_t n, int64_t D,
                                float scale, float* dots) {
  int64_t j = 0;
  if (D % 8 == 0) {
    for (; j + 4 <= n; j += 4) {
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
      for (int64_t d = 0; d < D; d += 8) {
        const __m256 qd = _mm256_loadu_ps(q + d);
        for (int u = 0; u < 4; ++u)
          acc[u] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(keys + (j + u) * D + d), acc[u]);
      }
      store_key_sums(acc, scale, dots + j);
    }
  }
  for (; j < n; ++j) dots[j] = Vec::dot(q, keys + j * D, D) * scale;
}

void AttentionLoops::key_scores_pair(const float* q0, const float* q1, const float* keys,
                                     int64_t n0, int64_t n1, int64_t D, float scale,
                                     float* dots0, float* dots1) {
  int64_t j = 0;
  if (D % 8 == 0) {
    for (; j + 4 <= n0; j += 4) {
      __m256 acc0[4], acc1[4];
      for (int u = 0; u < 4; ++u) acc0[u] = acc1[u] = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; d += 8) {
        const __m256 q0d = _mm256_loadu_ps(q0 + d), q1d = _mm256_loadu_ps(q1 + d);
        for (int u = 0; u < 4; ++u) {
          const __m256 key = _mm256_loadu_ps(keys + (j + u) * D + d);
          acc0[u] = _mm256_fmadd_ps(q0d, key, acc0[u]);
          acc1[u] = _mm256_fmadd_ps(q1d, key, acc1[u]);
        }
      }
      store_key_sums(acc0, scale, dots0 + j);
      store_key_sums(acc1, scale, dots1 + j);
    }
  }
  key_scores(q0, keys + j * D, n0 - j, D, scale, dots0 + j);
  key_scores(q1, keys + j * D, n1 - j, D, scale, dots1 + j);
}

void AttentionLoops::weighted_rows_pair(const float* w0, const float* w1, const float* rows,
                                        int64_t n0, int64_t n1, int64_t D, float* out0,
                                        float* out1, bool accumulate) {
  if (D % 64) {
    weighted_rows(w0, rows, n0, D, out0, accumulate);
    weighted_rows(w1, rows, n1, D, out1, accumulate);
    return;
  }
  for (int64_t d0 = 0; d0 < D; d0 += 32) {
    __m256 acc0[4], acc1[4];
    for (int u = 0; u < 4; ++u) {
      acc0[u] = accumulate ? _mm256_loadu_ps(out0 + d0 + 8 * u) : _mm256_setzero_ps();
      acc1[u] = accumulate ? _mm256_loadu_ps(out1 + d0 + 8 * u) : _mm256_setzero_ps();
    }
    for (int64_t j = 0; j < n0; ++j) {
      const bool use0 = w0[j] != 0.f, use1 = w1[j] != 0.f;
      if (!use0 && !use1) continue;
      const float* r = rows + j * D + d0;
      __m256 row[4];
      for (int u = 0; u < 4; ++u) row[u] = _mm256_loadu_ps(r + 8 * u);
      if (use0) {
        const __m256 wj = _mm256_set1_ps(w0[j]);
        for (int u = 0; u < 4; ++u) acc0[u] = _mm256_fmadd_ps(wj, row[u], acc0[u]);
      }
      if (use1) {
        const __m256 wj = _mm256_set1_ps(w1[j]);
        for (int u = 0; u < 4; ++u) acc1[u] = _mm256_fmadd_ps(wj, row[u], acc1[u]);
      }
    }
    for (int u = 0; u < 4; ++u) {
      _mm256_storeu_ps(out0 + d0 + 8 * u, acc0[u]);
      _mm256_storeu_ps(out1 + d0 + 8 * u, acc1[u]);
    }
  }
  if (n1 > n0) weighted_rows(w1 + n0, rows + n0 * D, n1 - n0, D, out1, true);
}

void AttentionLoops::dequantize_rows(const QuantizedRows& c, int bits, int64_t group_size,
                                     int64_t D, int64_t row0, int64_t n, float* out) {
  const int64_t row_bytes = D * bits / 8, groups = D / group_size;
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* codes = c.codes + (row0 + r) * row_bytes;
    const float* scales = c.scales + (row0 + r) * groups;
    const float* biases = c.biases + (row0 + r) * groups;
    float* row = out + r * D;
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* src = codes + g * group_size * bits / 8;
      float* dst = row + g * group_size;
      const float scale = scales[g], bias = biases[g];
      int64_t i = 0;
      const __m256 vscale = _mm256_set1_ps(scale), vbias = _mm256_set1_ps(bias);
      for (; i + 8 <= group_size; i += 8) {
        __m128i bytes;
        if (bits == 8) {
          bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i));
        } else {  // byte k holds code 2k (low nibble) and 2k + 1 (high)
          uint32_t packed;
          std::memcpy(&packed, src + i / 2, 4);
          const __m128i x = _mm_cvtsi32_si128(static_cast<int>(packed));
          const __m128i nibble = _mm_set1_epi8(0x0F);
          bytes = _mm_unpacklo_epi8(_mm_and_si128(x, nibble),
                                    _mm_and_si128(_mm_srli_epi16(x, 4), nibble));
        }
        _mm256_storeu_ps(dst + i, _mm256_fmadd_ps(u8x8_to_ps(bytes), vscale, vbias));
      }
      for (; i < group_size; ++i) {
        const int code = bits == 8 ? src[i] : (src[i / 2] >> (4 * (i % 2))) & 0x0F;
        dst[i] = scale * static_cast<float>(code) + bias;
      }
    }
  }
}

}  // namespace x86
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
