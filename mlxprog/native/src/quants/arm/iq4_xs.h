// arm IQ4_XS (NEON + dotprod): per 256, an fp16 d; per 32, a 6-bit signed
// scale; 4-bit indices into the 16 non-linear levels kIq4Levels.
// w = (d * scale) * kIq4Levels[q].
#pragma once

#include "kquant_neon.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The levels of half an IQ4_XS block (kquant_neon.h's codes_of): each
// sub-block of 32 is 16 bytes of qs, low nibbles the first 16 elements,
// high nibbles the next 16. table: kIq4Levels.
[[gnu::always_inline]] inline void iq4_xs_levels(const kquant::IQ4XS& b, int half, int8x16_t table,
                                                 int8x16_t levels[8]) {
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
#pragma GCC unroll 16
  for (int k = 0; k < 4; ++k) {
    const uint8x16_t q = vld1q_u8(b.qs + 64 * half + 16 * k);
    levels[2 * k] = vqtbl1q_s8(table, vandq_u8(q, low4));
    levels[2 * k + 1] = vqtbl1q_s8(table, vshrq_n_u8(q, 4));
  }
}

// A row of IQ4_XS blocks to float32, as gguf computes it.
void dequantize_row_iq4_xs(const uint8_t* src, float* y, int64_t n) {
  const kquant::IQ4XS* blocks = reinterpret_cast<const kquant::IQ4XS*>(src);
  const int8x16_t table = vld1q_s8(kIq4Levels);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    const kquant::IQ4XS& b = blocks[i];
    const float d = kquant::fp16_value(b.d);
    int8_t raw_scales[8];
    kquant::iq4_xs_scales(b, raw_scales);
    float scales[16];  // per 16 elements
    for (int j = 0; j < 16; ++j) scales[j] = d * static_cast<float>(raw_scales[j / 2]);
    kquant::write_scaled(
        scales, [&](int half, int8x16_t* levels) { iq4_xs_levels(b, half, table, levels); }, y);
  }
}

// IQ4_XS row . q8_K row: per block d_w * d_x * sum scale * (levels . q8).
float vec_dot_iq4_xs(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::IQ4XS* blocks = reinterpret_cast<const kquant::IQ4XS*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  const int8x16_t table = vld1q_s8(kIq4Levels);
  float32x4_t acc = vdupq_n_f32(0.0f);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    const kquant::IQ4XS& b = blocks[i];
    int8_t raw_scales[8];
    kquant::iq4_xs_scales(b, raw_scales);
    const int16x8_t scales = vmovl_s8(vld1_s8(raw_scales));
    const int32x4_t wide[2] = {vmovl_s16(vget_low_s16(scales)), vmovl_s16(vget_high_s16(scales))};
    const int32x4_t dot = kquant::scaled_dot_32(
        wide, [&](int half, int8x16_t* levels) { iq4_xs_levels(b, half, table, levels); }, x[i].qs);
    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(dot), x[i].d * kquant::fp16_value(b.d));
  }
  return vaddvq_f32(acc);
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
