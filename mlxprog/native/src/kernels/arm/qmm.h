// arm (NEON, with sdot where the table is compiled for armv8.2-a+dotprod):
// the transposed quantized matmul (4 and 8 bits) and its int8 numerics on
// 4-float vectors; the rest is portable/qmm.h's. NEON is arm64's baseline,
// so the portable table there uses these too.
#pragma once

#include <arm_neon.h>

#include "kernels/portable/qmm.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace arm {

using portable::Vec;  // arm64 has no row load or dot product of its own

// The 32 codes of a chunk as eight vectors of four floats (plane order).
template <int BITS>
inline void decode_chunk_neon(const uint8_t* src, float32x4_t w[8]) {
  uint8x16_t parts[2];
  if constexpr (BITS == 4) {
    const uint8x16_t b = vld1q_u8(src);
    parts[0] = vandq_u8(b, vdupq_n_u8(0x0F));
    parts[1] = vshrq_n_u8(b, 4);
  } else if constexpr (BITS == 8) {
    parts[0] = vld1q_u8(src);
    parts[1] = vld1q_u8(src + 16);
  } else {
    float codes[32];
    portable::decode_chunk(src, BITS, codes);
    for (int i = 0; i < 8; ++i) w[i] = vld1q_f32(codes + 4 * i);
    return;
  }
  for (int h = 0; h < 2; ++h) {
    const uint16x8_t lo = vmovl_u8(vget_low_u8(parts[h])), hi = vmovl_u8(vget_high_u8(parts[h]));
    w[4 * h + 0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo)));
    w[4 * h + 1] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo)));
    w[4 * h + 2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi)));
    w[4 * h + 3] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi)));
  }
}

// As x86/qmm.h's qmm_t_tile with four-lane vectors: NR weight rows by one row of x.
template <int BITS, int NR>
void qmm_t_tile_neon(const QmmProblem& p, int64_t m, int64_t n, float* params) {
  const int64_t K = p.K, gs = p.group_size, groups = K / gs, row_bytes = K * BITS / 8;
  const int chunks = static_cast<int>(gs / 32), chunk_bytes = 4 * BITS;
  float* scales = params;
  float* biases = params + NR * groups;
  Vec::load_row(p.scales, p.scales_dtype, n * groups, NR * groups, scales);
  Vec::load_row(p.biases, p.biases_dtype, n * groups, NR * groups, biases);
  float32x4_t acc[NR];
  float bias_terms[NR];
  for (int j = 0; j < NR; ++j) {
    acc[j] = vdupq_n_f32(0.f);
    bias_terms[j] = 0.f;
  }
  const float* xr = p.x + m * K;
  for (int64_t g = 0; g < groups; ++g) {
    float32x4_t dots[NR];
    for (int j = 0; j < NR; ++j) dots[j] = vdupq_n_f32(0.f);
    for (int c = 0; c < chunks; ++c) {
      const int64_t chunk = g * chunks + c;
      const float* xc = xr + chunk * 32;
      for (int j = 0; j < NR; ++j) {
        float32x4_t w[8];
        decode_chunk_neon<BITS>(p.w + (n + j) * row_bytes + chunk * chunk_bytes, w);
        float32x4_t d0 = vmulq_f32(w[0], vld1q_f32(xc)), d1 = vmulq_f32(w[1], vld1q_f32(xc + 4));
        for (int i = 2; i < 8; i += 2) {
          d0 = vfmaq_f32(d0, w[i], vld1q_f32(xc + 4 * i));
          d1 = vfmaq_f32(d1, w[i + 1], vld1q_f32(xc + 4 * i + 4));
        }
        dots[j] = vaddq_f32(dots[j], vaddq_f32(d0, d1));
      }
    }
    for (int j = 0; j < NR; ++j) {
      acc[j] = vfmaq_n_f32(acc[j], dots[j], scales[j * groups + g]);
      bias_terms[j] += biases[j * groups + g] * p.xsum[m * groups + g];
    }
  }
  for (int j = 0; j < NR; ++j) p.out[m * p.N + n + j] = vaddvq_f32(acc[j]) + bias_terms[j];
}

template <int BITS>
void qmm_t_neon(const QmmProblem& p, int64_t n0, int64_t n1) {
  float* params = new float[8 * (p.K / p.group_size)];
  for (int64_t m = 0; m < p.M; ++m) {
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) qmm_t_tile_neon<BITS, 4>(p, m, n, params);
    for (; n < n1; ++n) qmm_t_tile_neon<BITS, 1>(p, m, n, params);
  }
  delete[] params;
}

// -- int8 numerics (see portable/qmm.h) ------------------------------------------------
//
// As on x86, the vector paths multiply bytes: 4-bit codes as they are, 8-bit
// codes as code - 128 (signed bytes; the tile's biases take 128 * scale back).

// A tile's per-group factors: fac[(j * MB + r) * groups + g] = scale[n + j, g]
// * d[m0 + r, g], and the bias terms sum_g bias'[n + j, g] * d * sum q, where
// bias' = bias + 128 * scale for 8-bit codes (which the vector dots read as
// code - 128).
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
      for (; g < groups; ++g) {
        f[g] = s[g] * xd[g];
        bias += (b[g] + offset * s[g]) * xqsum[g];
      }
      bias_terms[j][r] = bias;
    }
}

// 32 codes of a chunk as two vectors of signed bytes: 4-bit codes (low
// nibbles, then high), 8-bit codes as code - 128.
template <int BITS>
inline void q8_codes_neon(const uint8_t* src, int8x16_t w[2]) {
  if constexpr (BITS == 4) {
    const uint8x16_t b = vld1q_u8(src);
    w[0] = vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0F)));
    w[1] = vreinterpretq_s8_u8(vshrq_n_u8(b, 4));
  } else {
    w[0] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(src), vdupq_n_u8(0x80)));
    w[1] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(src + 16), vdupq_n_u8(0x80)));
  }
}

// sum of w * q over 32 bytes, in four int32 lanes: sdot where the CPU has
// it (armv8.2 dotprod, its own table), widening multiplies otherwise.
inline int32x4_t q8_dot_neon(const int8x16_t w[2], const int8x16_t q[2]) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w[0], q[0]), w[1], q[1]);
#else
  int16x8_t lo = vmull_s8(vget_low_s8(w[0]), vget_low_s8(q[0]));
  lo = vmlal_s8(lo, vget_high_s8(w[0]), vget_high_s8(q[0]));
  int16x8_t hi = vmull_s8(vget_low_s8(w[1]), vget_low_s8(q[1]));
  hi = vmlal_s8(hi, vget_high_s8(w[1]), vget_high_s8(q[1]));
  return vpadalq_s16(vpaddlq_s16(lo), hi);
#endif
}

template <int BITS, int NR>
void qmm_q8_tile_neon(const QmmProblem& p, int64_t m, int64_t n, float* params, float* fac) {
  const int64_t K = p.K, gs = p.group_size, groups = K / gs, row_bytes = K * BITS / 8;
  const int chunks = static_cast<int>(gs / 32), chunk_bytes = 4 * BITS;
  float bias_terms[NR][1];
  q8_tile_factors<1, NR>(p, m, n, params, fac, bias_terms);
  float32x4_t acc[NR];
  for (int j = 0; j < NR; ++j) acc[j] = vdupq_n_f32(0.f);
  for (int64_t g = 0; g < groups; ++g) {
    int32x4_t sums[NR];
    for (int j = 0; j < NR; ++j) sums[j] = vdupq_n_s32(0);
    for (int c = 0; c < chunks; ++c) {
      const int64_t chunk = g * chunks + c;
      const int8_t* qc = p.xq + m * K + chunk * 32;
      const int8x16_t q[2] = {vld1q_s8(qc), vld1q_s8(qc + 16)};
      for (int j = 0; j < NR; ++j) {
        int8x16_t w[2];
        q8_codes_neon<BITS>(p.w + (n + j) * row_bytes + chunk * chunk_bytes, w);
        sums[j] = vaddq_s32(sums[j], q8_dot_neon(w, q));
      }
    }
    for (int j = 0; j < NR; ++j)
      acc[j] = vfmaq_n_f32(acc[j], vcvtq_f32_s32(sums[j]), fac[j * groups + g]);
  }
  for (int j = 0; j < NR; ++j) p.out[m * p.N + n + j] = vaddvq_f32(acc[j]) + bias_terms[j][0];
}

template <int BITS>
void qmm_q8_neon(const QmmProblem& p, int64_t n0, int64_t n1) {
  const int64_t groups = p.K / p.group_size;
  float* params = new float[8 * groups];
  float* fac = new float[4 * groups];
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4)
    for (int64_t m = 0; m < p.M; ++m) qmm_q8_tile_neon<BITS, 4>(p, m, n, params, fac);
  for (; n < n1; ++n)
    for (int64_t m = 0; m < p.M; ++m) qmm_q8_tile_neon<BITS, 1>(p, m, n, params, fac);
  delete[] fac;
  delete[] params;
}

void qmm(const QmmProblem& p, int64_t n0, int64_t n1) {
  if (!p.transpose) return portable::qmm_n(p, n0, n1);
  switch (p.bits) {
    case 4: return qmm_t_neon<4>(p, n0, n1);
    case 8: return qmm_t_neon<8>(p, n0, n1);
    default: break;
  }
  portable::qmm_t(p, n0, n1);
}

void qmm_q8(const QmmProblem& p, int64_t n0, int64_t n1) {
  if (p.bits == 4) return qmm_q8_neon<4>(p, n0, n1);
  if (p.bits == 8) return qmm_q8_neon<8>(p, n0, n1);
  portable::qmm_q8(p, n0, n1);
}

}  // namespace arm
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
