// x86 (AVX2+FMA, with AVX-VNNI or AVX512-VNNI byte dot products where the
// table defines MLXPROG_VNNI_AVX or MLXPROG_VNNI_AVX512): the transposed
// quantized matmul (bits 2 to 8) and its int8 numerics (4 and 8 bits) on
// 8-float vectors; the rest is portable/qmm.h's.
#pragma once

#include <immintrin.h>

#include "kernels/portable/qmm.h"
#include "kernels/x86/vec.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace x86 {

// The 32 codes of a chunk as four vectors of floats (in plane order, see
// portable/qmm.h).
template <int BITS>
inline void decode_chunk_avx2(const uint8_t* src, __m256 w[4]) {
  if constexpr (BITS == 8) {
    for (int i = 0; i < 4; ++i)
      w[i] = u8x8_to_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 8 * i)));
  } else if constexpr (BITS == 4) {
    const __m128i mask = _mm_set1_epi8(0x0F);
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    __m128i lo = _mm_and_si128(b, mask);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    w[0] = u8x8_to_ps(lo);
    w[1] = u8x8_to_ps(_mm_unpackhi_epi64(lo, lo));
    w[2] = u8x8_to_ps(hi);
    w[3] = u8x8_to_ps(_mm_unpackhi_epi64(hi, hi));
  } else if constexpr (BITS == 2) {
    const __m128i mask = _mm_set1_epi8(0x03);
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src));
    for (int p = 0; p < 4; ++p)
      w[p] = u8x8_to_ps(_mm_and_si128(_mm_srli_epi16(b, 2 * p), mask));
  } else {
    float codes[32];
    portable::decode_chunk(src, BITS, codes);
    for (int i = 0; i < 4; ++i) w[i] = _mm256_loadu_ps(codes + 8 * i);
  }
}

// `count` scales or biases from `src` (in `t`) as float32.
void load_params(const void* src, DType t, int64_t offset, int64_t count, float* dst) {
  if (t == DType::f32) {
    std::memcpy(dst, static_cast<const float*>(src) + offset, count * sizeof(float));
    return;
  }
  const uint16_t* p = static_cast<const uint16_t*>(src) + offset;
  int64_t i = 0;
  if (t == DType::f16) {
    for (; i + 8 <= count; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i))));
    for (; i < count; ++i) dst[i] = _cvtsh_ss(p[i]);
  } else {
    for (; i < count; ++i) dst[i] = bf16_to_float(p[i]);
  }
}

// Rows [m0, m0 + MB) of x against NR weight rows from n: each chunk of codes
// is decoded once and used for MB rows of x; the NR x MB accumulator chains
// are independent, so the FMAs overlap.
template <int BITS, int GS, int MB, int NR>
void qmm_t_tile(const QmmProblem& p, int64_t m0, int64_t n, float* params) {
  const int64_t K = p.K, groups = K / GS, row_bytes = K * BITS / 8;
  constexpr int chunks = GS / 32, chunk_bytes = 4 * BITS;
  // The tile's scales and biases as float32: [NR][groups] each.
  float* scales = params;
  float* biases = params + NR * groups;
  load_params(p.scales, p.scales_dtype, n * groups, NR * groups, scales);
  load_params(p.biases, p.biases_dtype, n * groups, NR * groups, biases);
  __m256 acc[NR][MB];
  float bias_terms[NR][MB];
  for (int j = 0; j < NR; ++j)
    for (int r = 0; r < MB; ++r) {
      acc[j][r] = _mm256_setzero_ps();
      bias_terms[j][r] = 0.f;
    }
  for (int64_t g = 0; g < groups; ++g) {
    __m256 dots[NR][MB];
    for (int j = 0; j < NR; ++j)
      for (int r = 0; r < MB; ++r) dots[j][r] = _mm256_setzero_ps();
    for (int c = 0; c < chunks; ++c) {
      const int64_t chunk = g * chunks + c;
      for (int j = 0; j < NR; ++j) {
        __m256 w[4];
        const uint8_t* src = p.w + (n + j) * row_bytes + chunk * chunk_bytes;
        // The next tile's codes (see qmm_q8_tile).
        _mm_prefetch(reinterpret_cast<const char*>(src + NR * row_bytes), _MM_HINT_T0);
        decode_chunk_avx2<BITS>(src, w);
        for (int r = 0; r < MB; ++r) {
          const float* xr = p.x + (m0 + r) * K + chunk * 32;
          __m256 lo = _mm256_mul_ps(w[0], _mm256_loadu_ps(xr));
          __m256 hi = _mm256_mul_ps(w[1], _mm256_loadu_ps(xr + 8));
          lo = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xr + 16), lo);
          hi = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xr + 24), hi);
          dots[j][r] = _mm256_add_ps(dots[j][r], _mm256_add_ps(lo, hi));
        }
      }
    }
    for (int j = 0; j < NR; ++j) {
      const __m256 scale = _mm256_broadcast_ss(scales + j * groups + g);
      const float bias = biases[j * groups + g];
      for (int r = 0; r < MB; ++r) {
        acc[j][r] = _mm256_fmadd_ps(dots[j][r], scale, acc[j][r]);
        bias_terms[j][r] += bias * p.xsum[(m0 + r) * groups + g];
      }
    }
  }
  for (int j = 0; j < NR; ++j)
    for (int r = 0; r < MB; ++r) p.out[(m0 + r) * p.N + n + j] = hsum(acc[j][r]) + bias_terms[j][r];
}

template <int BITS, int GS, int MB>
void qmm_t_rows(const QmmProblem& p, int64_t m0, int64_t n0, int64_t n1, float* params) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) qmm_t_tile<BITS, GS, MB, 4>(p, m0, n, params);
  for (; n < n1; ++n) qmm_t_tile<BITS, GS, MB, 1>(p, m0, n, params);
}

// NR weight rows from n against every row of x, for a batch of rows (M >=
// WIDE_ROWS, a batched decode step): the rows are dequantized once into
// floats (`rows`, NR x K: code * scale + bias, in the order prepare_qmm_x
// stored x) and then read by every row of x, so the decoding, which costs
// more than the FMAs, is shared by the whole batch; each dot product runs on
// 2 x NR independent accumulators.
template <int BITS, int GS, int NR>
void qmm_t_tile_wide(const QmmProblem& p, int64_t n, float* params, float* rows) {
  const int64_t K = p.K, groups = K / GS, row_bytes = K * BITS / 8;
  constexpr int chunks = GS / 32, chunk_bytes = 4 * BITS;
  float* scales = params;
  float* biases = params + NR * groups;
  load_params(p.scales, p.scales_dtype, n * groups, NR * groups, scales);
  load_params(p.biases, p.biases_dtype, n * groups, NR * groups, biases);
  for (int j = 0; j < NR; ++j)
    for (int64_t g = 0; g < groups; ++g) {
      const __m256 scale = _mm256_broadcast_ss(scales + j * groups + g);
      const __m256 bias = _mm256_broadcast_ss(biases + j * groups + g);
      for (int c = 0; c < chunks; ++c) {
        __m256 w[4];
        decode_chunk_avx2<BITS>(p.w + (n + j) * row_bytes + (g * chunks + c) * chunk_bytes, w);
        float* dst = rows + j * K + g * GS + c * 32;
        for (int v = 0; v < 4; ++v) _mm256_storeu_ps(dst + 8 * v, _mm256_fmadd_ps(w[v], scale, bias));
      }
    }
  for (int64_t m = 0; m < p.M; ++m) {
    const float* xr = p.x + m * K;
    __m256 acc[NR][2];
    for (int j = 0; j < NR; ++j) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
      const __m256 x0 = _mm256_loadu_ps(xr + k), x1 = _mm256_loadu_ps(xr + k + 8);
      for (int j = 0; j < NR; ++j) {
        acc[j][0] = _mm256_fmadd_ps(_mm256_loadu_ps(rows + j * K + k), x0, acc[j][0]);
        acc[j][1] = _mm256_fmadd_ps(_mm256_loadu_ps(rows + j * K + k + 8), x1, acc[j][1]);
      }
    }
    for (int j = 0; j < NR; ++j) p.out[m * p.N + n + j] = hsum(_mm256_add_ps(acc[j][0], acc[j][1]));
  }
}

// From this many rows of x on, the weights are decoded once for all rows.
constexpr int64_t WIDE_ROWS = 3;

template <int BITS, int GS>
void qmm_t_avx2(const QmmProblem& p, int64_t n0, int64_t n1) {
  float* params = new float[8 * (p.K / GS)];
  if (p.M >= WIDE_ROWS) {
    constexpr int NR = 4;
    float* rows = new float[NR * p.K];
    int64_t n = n0;
    for (; n + NR <= n1; n += NR) qmm_t_tile_wide<BITS, GS, NR>(p, n, params, rows);
    for (; n < n1; ++n) qmm_t_tile_wide<BITS, GS, 1>(p, n, params, rows);
    delete[] rows;
  } else {
    int64_t m = 0;
    for (; m + 2 <= p.M; m += 2) qmm_t_rows<BITS, GS, 2>(p, m, n0, n1, params);
    for (; m < p.M; ++m) qmm_t_rows<BITS, GS, 1>(p, m, n0, n1, params);
  }
  delete[] params;
}

template <int BITS>
void qmm_t_avx2_bits(const QmmProblem& p, int64_t n0, int64_t n1) {
  switch (p.group_size) {
    case 32: return qmm_t_avx2<BITS, 32>(p, n0, n1);
    case 64: return qmm_t_avx2<BITS, 64>(p, n0, n1);
    default: return qmm_t_avx2<BITS, 128>(p, n0, n1);
  }
}

// -- int8 numerics (see portable/qmm.h) ------------------------------------------------
//
// The vector paths multiply bytes: 4-bit codes are unsigned bytes; 8-bit
// codes enter as code - 128 (a signed byte; the tile's biases take 128 *
// scale back, which is exact integer algebra: sum code * q = sum (code - 128)
// * q + 128 * sum q), because AVX2's maddubs takes one unsigned and one
// signed byte and the pairwise sums must fit in int16.

// A tile's per-group factors: fac[(j * MB + r) * groups + g] = scale[n + j, g]
// * d[m0 + r, g], and the bias terms sum_g bias'[n + j, g] * d * sum q, where
// bias' = bias + 128 * scale for 8-bit codes (which the vector dots read as
// code - 128). They take a noticeable share of a decode step's matmul, which
// reads only 18 to 48 groups per row: the tile's scales and biases are
// converted once into `params` and the factors computed with vector code.
// (Tried: one pass for blocks of 16 or 64 rows before their tiles, slower
// by 5-15% on one thread.)
template <int MB, int NR>
void q8_tile_factors(const QmmProblem& p, int64_t m0, int64_t n, float* params, float* fac,
                     float bias_terms[NR][MB]) {
  const int64_t groups = p.K / p.group_size;
  float* scales = params;
  float* biases = params + NR * groups;
  Vec::load_row(p.scales, p.scales_dtype, n * groups, NR * groups, scales);
  Vec::load_row(p.biases, p.biases_dtype, n * groups, NR * groups, biases);
  const float offset = p.bits == 8 ? 128.f : 0.f;
  for (int j = 0; j < NR; ++j)
    for (int r = 0; r < MB; ++r) {
      const float* xd = p.xd + (m0 + r) * groups;
      const float* xqsum = p.xqsum + (m0 + r) * groups;
      const float* s = scales + j * groups;
      const float* b = biases + j * groups;
      float* f = fac + (j * MB + r) * groups;
      float bias = 0.f;
      int64_t g = 0;
      const __m256 off = _mm256_set1_ps(offset);
      __m256 bias_v = _mm256_setzero_ps();
      for (; g + 8 <= groups; g += 8) {
        const __m256 sv = _mm256_loadu_ps(s + g);
        _mm256_storeu_ps(f + g, _mm256_mul_ps(sv, _mm256_loadu_ps(xd + g)));
        bias_v = _mm256_fmadd_ps(_mm256_fmadd_ps(off, sv, _mm256_loadu_ps(b + g)),
                                 _mm256_loadu_ps(xqsum + g), bias_v);
      }
      bias = hsum(bias_v);
      for (; g < groups; ++g) {
        f[g] = s[g] * xd[g];
        bias += (b[g] + offset * s[g]) * xqsum[g];
      }
      bias_terms[j][r] = bias;
    }
}

// 32 codes of a chunk as bytes: 4-bit codes unsigned (low nibbles, then high
// nibbles), 8-bit codes as code - 128.
template <int BITS>
inline __m256i q8_codes(const uint8_t* src) {
  if constexpr (BITS == 4) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
  } else {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  }
}

// sum of w * q over the chunk, in eight int32 lanes.
template <int BITS>
inline __m256i q8_dot(__m256i w, __m256i q) {
  if constexpr (BITS == 8) {  // |w| as unsigned bytes, its sign moved onto q
    q = _mm256_sign_epi8(q, w);
    w = _mm256_sign_epi8(w, w);
  }
#if MLXPROG_VNNI_AVX512
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, q);
#elif MLXPROG_VNNI_AVX
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, q);
#else
  // Pairs of products fit int16: 15 * 127 * 2 (4 bits) and 128 * 127 * 2 (8).
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, q), _mm256_set1_epi16(1));
#endif
}

// Rows [m0, m0 + MB) of x against NR weight rows from n.
template <int BITS, int GS, int MB, int NR>
void qmm_q8_tile(const QmmProblem& p, int64_t m0, int64_t n, float* params, float* fac) {
  const int64_t K = p.K, groups = K / GS, row_bytes = K * BITS / 8;
  constexpr int chunks = GS / 32, chunk_bytes = 4 * BITS;
  float bias_terms[NR][MB];
  q8_tile_factors<MB, NR>(p, m0, n, params, fac, bias_terms);
  __m256 acc[NR][MB];
  for (int j = 0; j < NR; ++j)
    for (int r = 0; r < MB; ++r) acc[j][r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256i sums[NR][MB];
    for (int c = 0; c < chunks; ++c) {
      const int64_t chunk = g * chunks + c;
      __m256i q[MB];
      for (int r = 0; r < MB; ++r)
        q[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.xq + (m0 + r) * K + chunk * 32));
      for (int j = 0; j < NR; ++j) {
        const uint8_t* src = p.w + (n + j) * row_bytes + chunk * chunk_bytes;
        // The next tile's codes: weights stream from memory, and the
        // hardware prefetcher alone leaves the kernel waiting (measured:
        // 576 x 1536, 4-bit, one thread: 78 us without, 57 us with).
        _mm_prefetch(reinterpret_cast<const char*>(src + NR * row_bytes), _MM_HINT_T0);
        const __m256i w = q8_codes<BITS>(src);
        for (int r = 0; r < MB; ++r) {
          const __m256i d = q8_dot<BITS>(w, q[r]);
          sums[j][r] = c == 0 ? d : _mm256_add_epi32(sums[j][r], d);
        }
      }
    }
    for (int j = 0; j < NR; ++j)
      for (int r = 0; r < MB; ++r)
        acc[j][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[j][r]),
                                    _mm256_broadcast_ss(fac + (j * MB + r) * groups + g), acc[j][r]);
  }
  for (int j = 0; j < NR; ++j)
    for (int r = 0; r < MB; ++r)
      p.out[(m0 + r) * p.N + n + j] = hsum(acc[j][r]) + bias_terms[j][r];
}

// 4-bit codes, two chunks (64 codes) at a time: one 32-byte load holds both
// chunks' bytes, so masking the low nibbles gives the first bit plane of
// both and shifting the high ones the second; q is permuted to match (once
// per x row, shared by the NR weight rows). The two byte products of a pair
// are added in int16 (at most 4 * 15 * 127) before one widening, and one
// conversion and FMA cover 64 codes: each 128-bit half of the sums belongs
// to one chunk, so the factor vector holds each chunk's factor four times.
template <int GS, int MB, int NR>
void qmm_q8_tile_4bit_pairs(const QmmProblem& p, int64_t m0, int64_t n, float* params,
                            float* fac) {
  const int64_t K = p.K, groups = K / GS, row_bytes = K / 2, chunks = K / 32;
  float bias_terms[NR][MB];
  q8_tile_factors<MB, NR>(p, m0, n, params, fac, bias_terms);
  __m256 acc[NR][MB];
  for (int j = 0; j < NR; ++j)
    for (int r = 0; r < MB; ++r) acc[j][r] = _mm256_setzero_ps();
  const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  int64_t c = 0;
  for (; c + 2 <= chunks; c += 2) {
    const int64_t g0 = c * 32 / GS, g1 = (c + 1) * 32 / GS;
    __m256i q_lo[MB], q_hi[MB];
    for (int r = 0; r < MB; ++r) {
      const int8_t* qc = p.xq + (m0 + r) * K + c * 32;
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qc));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qc + 32));
      q_lo[r] = _mm256_permute2x128_si256(a, b, 0x20);  // both chunks' first planes
      q_hi[r] = _mm256_permute2x128_si256(a, b, 0x31);
    }
    for (int j = 0; j < NR; ++j) {
      const uint8_t* src = p.w + (n + j) * row_bytes + c * 16;
      _mm_prefetch(reinterpret_cast<const char*>(src + NR * row_bytes), _MM_HINT_T0);  // see qmm_q8_tile
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
      const __m256i lo = _mm256_and_si256(bytes, mask);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask);
      for (int r = 0; r < MB; ++r) {
        const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, q_lo[r]),
                                               _mm256_maddubs_epi16(hi, q_hi[r]));
        const float* f = fac + (j * MB + r) * groups;
        const __m256 factor = _mm256_set_m128(_mm_broadcast_ss(f + g1), _mm_broadcast_ss(f + g0));
        acc[j][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones)), factor,
                                    acc[j][r]);
      }
    }
  }
  if (c < chunks) {  // an odd chunk count: the last chunk alone
    const int64_t g = c * 32 / GS;
    for (int r = 0; r < MB; ++r) {
      const __m256i q = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(p.xq + (m0 + r) * K + c * 32));
      for (int j = 0; j < NR; ++j) {
        const __m256i d = q8_dot<4>(q8_codes<4>(p.w + (n + j) * row_bytes + c * 16), q);
        acc[j][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d),
                                    _mm256_broadcast_ss(fac + (j * MB + r) * groups + g),
                                    acc[j][r]);
      }
    }
  }
  for (int j = 0; j < NR; ++j)
    for (int r = 0; r < MB; ++r)
      p.out[(m0 + r) * p.N + n + j] = hsum(acc[j][r]) + bias_terms[j][r];
}

// From this many rows of x on (a large batch, a prefill), the float kernel
// on xhat, which decodes the weights once for all rows, is faster than the
// integer one (measured on AVX2: equal at 8 rows, 1.3x faster at 42).
constexpr int64_t Q8_WIDE_ROWS = 8;
static_assert(Q8_WIDE_ROWS >= WIDE_ROWS, "xhat goes to the float kernel's wide path only");

// Weight rows in blocks of four (the block's codes stay in L1 while every
// row of x passes over them), rows of x in pairs.
template <int BITS, int GS>
void qmm_q8_avx2(const QmmProblem& p, int64_t n0, int64_t n1) {
  const int64_t groups = p.K / GS;
  float* params = new float[8 * groups];
  float* fac = new float[8 * groups];
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    int64_t m = 0;
#if !MLXPROG_VNNI_AVX512 && !MLXPROG_VNNI_AVX
    if constexpr (BITS == 4) {  // without VNNI, pairs of chunks save instructions
      for (; m + 2 <= p.M; m += 2) qmm_q8_tile_4bit_pairs<GS, 2, 4>(p, m, n, params, fac);
      for (; m < p.M; ++m) qmm_q8_tile_4bit_pairs<GS, 1, 4>(p, m, n, params, fac);
    }
#endif
    for (; m + 2 <= p.M; m += 2) qmm_q8_tile<BITS, GS, 2, 4>(p, m, n, params, fac);
    for (; m < p.M; ++m) qmm_q8_tile<BITS, GS, 1, 4>(p, m, n, params, fac);
  }
  for (; n < n1; ++n)
    for (int64_t m = 0; m < p.M; ++m) qmm_q8_tile<BITS, GS, 1, 1>(p, m, n, params, fac);
  delete[] fac;
  delete[] params;
}

template <int BITS>
void qmm_q8_avx2_bits(const QmmProblem& p, int64_t n0, int64_t n1) {
  switch (p.group_size) {
    case 32: return qmm_q8_avx2<BITS, 32>(p, n0, n1);
    case 64: return qmm_q8_avx2<BITS, 64>(p, n0, n1);
    default: return qmm_q8_avx2<BITS, 128>(p, n0, n1);
  }
}

void qmm(const QmmProblem& p, int64_t n0, int64_t n1) {
  if (!p.transpose) return portable::qmm_n(p, n0, n1);
  switch (p.bits) {
    case 2: return qmm_t_avx2_bits<2>(p, n0, n1);
    case 3: return qmm_t_avx2_bits<3>(p, n0, n1);
    case 4: return qmm_t_avx2_bits<4>(p, n0, n1);
    case 5: return qmm_t_avx2_bits<5>(p, n0, n1);
    case 6: return qmm_t_avx2_bits<6>(p, n0, n1);
    case 8: return qmm_t_avx2_bits<8>(p, n0, n1);
    default: break;
  }
  portable::qmm_t(p, n0, n1);
}

void qmm_q8(const QmmProblem& p, int64_t n0, int64_t n1) {
  if (p.M >= Q8_WIDE_ROWS) {
    // Many rows: the same result, dequantize(w) @ xhat, from the float
    // kernel that decodes the weights once for all rows (p.x holds xhat).
    if (p.bits == 4) return qmm_t_avx2_bits<4>(p, n0, n1);
    if (p.bits == 8) return qmm_t_avx2_bits<8>(p, n0, n1);
  }
  if (p.bits == 4) return qmm_q8_avx2_bits<4>(p, n0, n1);
  if (p.bits == 8) return qmm_q8_avx2_bits<8>(p, n0, n1);
  portable::qmm_q8(p, n0, n1);
}

}  // namespace x86
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
