// arm Q6_K (NEON + dotprod): per 256, an fp16 d; per 16, an int8 scale;
// 6-bit codes q - 32. w = (d * scale) * (q - 32).
#pragma once

#include "kquant_neon.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The unsigned 6-bit codes q (0..63) of half a Q6_K block (kquant_neon.h's
// codes_of): group s of 32 elements is the low (s < 2) or high nibbles of
// the half's 32-byte run s % 2 of ql, with bits 2s..2s+1 of its 32 bytes of
// qh (portable/q6_k.h has the layout).
[[gnu::always_inline]] inline void q6_k_codes(const kquant::Q6K& b, int half, int8x16_t codes[8]) {
  const uint8x16_t three = vdupq_n_u8(3), bits45 = vdupq_n_u8(0x30);
#pragma GCC unroll 16
  for (int j = 0; j < 2; ++j) {
    const uint8x16_t run0 = vld1q_u8(b.ql + 64 * half + 16 * j);
    const uint8x16_t run1 = vld1q_u8(b.ql + 64 * half + 32 + 16 * j);
    const uint8x16_t qh = vld1q_u8(b.qh + 32 * half + 16 * j);
    // vsli keeps the low nibble of its first operand under the shifted second.
    codes[j] = kquant::as_s8(vsliq_n_u8(run0, vandq_u8(qh, three), 4));
    codes[2 + j] = kquant::as_s8(vsliq_n_u8(run1, vandq_u8(vshrq_n_u8(qh, 2), three), 4));
    codes[4 + j] = kquant::as_s8(vorrq_u8(vshrq_n_u8(run0, 4), vandq_u8(qh, bits45)));
    codes[6 + j] =
        kquant::as_s8(vorrq_u8(vshrq_n_u8(run1, 4), vandq_u8(vshrq_n_u8(qh, 2), bits45)));
  }
}

// A row of Q6_K blocks to float32, as gguf computes it.
void dequantize_row_q6_k(const uint8_t* src, float* y, int64_t n) {
  const kquant::Q6K* blocks = reinterpret_cast<const kquant::Q6K*>(src);
  const int8x16_t offset = vdupq_n_s8(32);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    const kquant::Q6K& b = blocks[i];
    const float d = kquant::fp16_value(b.d);
    float scales[16];
    for (int j = 0; j < 16; ++j) scales[j] = d * static_cast<float>(b.scales[j]);
    kquant::write_scaled(
        scales,
        [&](int half, int8x16_t* codes) {
          q6_k_codes(b, half, codes);
#pragma GCC unroll 16
          for (int j = 0; j < 8; ++j) codes[j] = vsubq_s8(codes[j], offset);
        },
        y);
  }
}

// Q6_K row . q8_K row: per block sum scale * (q . q8) - 32 * sum scale *
// (the q8 sums of its 16), one float multiply-add by d_w * d_x.
float vec_dot_q6_k(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::Q6K* blocks = reinterpret_cast<const kquant::Q6K*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float32x4_t acc = vdupq_n_f32(0.0f);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    const kquant::Q6K& b = blocks[i];
    const int8x16_t scales = vld1q_s8(b.scales);
    const int32x4_t offset_dot = kquant::weighted_sums_16(
        vmovl_s8(vget_low_s8(scales)), vmovl_s8(vget_high_s8(scales)), x[i].bsums);
    const int32x4_t dot = kquant::scaled_dot_16(
        kquant::widen_s8(scales), [&](int half, int8x16_t* codes) { q6_k_codes(b, half, codes); },
        x[i].qs);
    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(vsubq_s32(dot, vshlq_n_s32(offset_dot, 5))),
                      x[i].d * kquant::fp16_value(b.d));
  }
  return vaddvq_f32(acc);
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
