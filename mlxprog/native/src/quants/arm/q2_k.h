// arm Q2_K (NEON + dotprod): per 256, fp16 d and dmin; per 16, a 4-bit
// scale and a 4-bit min; 2-bit codes q. w = (d * scale) * q - dmin * min.
#pragma once

#include "kquant_neon.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The 2-bit codes of half a Q2_K block (kquant_neon.h's codes_of): group s
// of 32 elements is bits 2s..2s+1 of the half's 32 bytes of qs.
[[gnu::always_inline]] inline void q2_k_codes(const kquant::Q2K& b, int half, int8x16_t codes[8]) {
  const uint8x16_t three = vdupq_n_u8(3);
  const uint8x16_t q[2] = {vld1q_u8(b.qs + 32 * half), vld1q_u8(b.qs + 32 * half + 16)};
#pragma GCC unroll 16
  for (int j = 0; j < 2; ++j) {
    codes[j] = kquant::as_s8(vandq_u8(q[j], three));
    codes[2 + j] = kquant::as_s8(vandq_u8(vshrq_n_u8(q[j], 2), three));
    codes[4 + j] = kquant::as_s8(vandq_u8(vshrq_n_u8(q[j], 4), three));
    codes[6 + j] = kquant::as_s8(vshrq_n_u8(q[j], 6));
  }
}

// A row of Q2_K blocks to float32, as gguf computes it.
void dequantize_row_q2_k(const uint8_t* src, float* y, int64_t n) {
  const kquant::Q2K* blocks = reinterpret_cast<const kquant::Q2K*>(src);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    const kquant::Q2K& b = blocks[i];
    const float d = kquant::fp16_value(b.d), dmin = kquant::fp16_value(b.dmin);
    float scales[16], offsets[16];
    for (int j = 0; j < 16; ++j) {
      scales[j] = d * static_cast<float>(b.scales[j] & 0x0F);
      offsets[j] = dmin * static_cast<float>(b.scales[j] >> 4);
    }
    kquant::write_scaled_minus(
        scales, offsets, [&](int half, int8x16_t* codes) { q2_k_codes(b, half, codes); }, y);
  }
}

// Q2_K row . q8_K row: per block d_w * d_x * sum scale * (q . q8) minus
// dmin_w * d_x * sum min * (the q8 sums of its 16).
float vec_dot_q2_k(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::Q2K* blocks = reinterpret_cast<const kquant::Q2K*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float32x4_t acc = vdupq_n_f32(0.0f);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    const kquant::Q2K& b = blocks[i];
    const uint8x16_t packed = vld1q_u8(b.scales);
    const uint8x16_t mins = vshrq_n_u8(packed, 4);
    const int32x4_t min_dot =
        kquant::weighted_sums_16(vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins))),
                                 vreinterpretq_s16_u16(vmovl_u8(vget_high_u8(mins))), x[i].bsums);
    const int32x4_t dot = kquant::scaled_dot_16(
        kquant::widen_u8(vandq_u8(packed, vdupq_n_u8(0x0F))),
        [&](int half, int8x16_t* codes) { q2_k_codes(b, half, codes); }, x[i].qs);
    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(dot), x[i].d * kquant::fp16_value(b.d));
    acc = vfmsq_n_f32(acc, vcvtq_f32_s32(min_dot), x[i].d * kquant::fp16_value(b.dmin));
  }
  return vaddvq_f32(acc);
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
