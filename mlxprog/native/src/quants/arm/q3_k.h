// arm Q3_K (NEON + dotprod): per 256, an fp16 d; per 16, a 6-bit signed
// scale; 3-bit codes q in -4..3. w = (d * scale) * q.
#pragma once

#include "kquant_neon.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The codes + 4 (0..7) of half a Q3_K block (kquant_neon.h's codes_of): two
// bits from qs as Q2_K lays them out, the third (4) from bit 4 * half + s
// of each byte of hmask for group s.
[[gnu::always_inline]] inline void q3_k_codes(const kquant::Q3K& b, int half, int8x16_t codes[8]) {
  const uint8x16_t three = vdupq_n_u8(3), four = vdupq_n_u8(4);
#pragma GCC unroll 16
  for (int j = 0; j < 2; ++j) {
    const uint8x16_t q = vld1q_u8(b.qs + 32 * half + 16 * j);
    const uint8x16_t mask = vld1q_u8(b.hmask + 16 * j);
    uint8x16_t high = half ? vshrq_n_u8(mask, 4) : mask;  // group s's bit, moved to bit 0
    const uint8x16_t low[4] = {vandq_u8(q, three), vandq_u8(vshrq_n_u8(q, 2), three),
                               vandq_u8(vshrq_n_u8(q, 4), three), vshrq_n_u8(q, 6)};
#pragma GCC unroll 16
    for (int s = 0; s < 4; ++s) {
      codes[2 * s + j] = kquant::as_s8(vorrq_u8(low[s], vandq_u8(vshlq_n_u8(high, 2), four)));
      high = vshrq_n_u8(high, 1);
    }
  }
}

// A row of Q3_K blocks to float32, as gguf computes it.
void dequantize_row_q3_k(const uint8_t* src, float* y, int64_t n) {
  const kquant::Q3K* blocks = reinterpret_cast<const kquant::Q3K*>(src);
  const int8x16_t four = vdupq_n_s8(4);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    const kquant::Q3K& b = blocks[i];
    const float d = kquant::fp16_value(b.d);
    int8_t raw_scales[16];
    kquant::q3_k_scales(b.scales, raw_scales);
    float scales[16];
    for (int j = 0; j < 16; ++j) scales[j] = d * static_cast<float>(raw_scales[j]);
    kquant::write_scaled(
        scales,
        [&](int half, int8x16_t* codes) {
          q3_k_codes(b, half, codes);
#pragma GCC unroll 16
          for (int j = 0; j < 8; ++j) codes[j] = vsubq_s8(codes[j], four);
        },
        y);
  }
}

// Q3_K row . q8_K row: per block sum scale * ((q + 4) . q8) - 4 * sum scale
// * (the q8 sums of its 16), one float multiply-add by d_w * d_x.
float vec_dot_q3_k(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::Q3K* blocks = reinterpret_cast<const kquant::Q3K*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float32x4_t acc = vdupq_n_f32(0.0f);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    const kquant::Q3K& b = blocks[i];
    int8_t raw_scales[16];
    kquant::q3_k_scales(b.scales, raw_scales);
    const int8x16_t scales = vld1q_s8(raw_scales);
    const int32x4_t offset_dot = kquant::weighted_sums_16(
        vmovl_s8(vget_low_s8(scales)), vmovl_s8(vget_high_s8(scales)), x[i].bsums);
    const int32x4_t dot = kquant::scaled_dot_16(
        kquant::widen_s8(scales), [&](int half, int8x16_t* codes) { q3_k_codes(b, half, codes); },
        x[i].qs);
    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(vsubq_s32(dot, vshlq_n_s32(offset_dot, 2))),
                      x[i].d * kquant::fp16_value(b.d));
  }
  return vaddvq_f32(acc);
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
