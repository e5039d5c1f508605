// arm Q4_K (NEON + dotprod): per 256, fp16 d and dmin; per 32, a 6-bit
// scale and a 6-bit min; 4-bit codes q. w = (d * scale) * q - dmin * min.
// Its block kernels are shared with Q5_K (same scales, one more code bit).
#pragma once

#include "kquant_neon.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The 4-bit codes of half a Q4_K/Q5_K block (kquant_neon.h's codes_of):
// each 32 bytes of qs hold one sub-block of 32 in their low nibbles and the
// next in their high nibbles.
[[gnu::always_inline]] inline void q4_k_codes(const uint8_t* qs, int half, int8x16_t codes[8]) {
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
#pragma GCC unroll 16
  for (int chunk = 0; chunk < 2; ++chunk)
#pragma GCC unroll 16
    for (int j = 0; j < 2; ++j) {
      const uint8x16_t q = vld1q_u8(qs + 64 * half + 32 * chunk + 16 * j);
      codes[4 * chunk + j] = kquant::as_s8(vandq_u8(q, low4));
      codes[4 * chunk + 2 + j] = kquant::as_s8(vshrq_n_u8(q, 4));
    }
}

// One Q4_K/Q5_K block . its q8_K block added to acc: d_w * d_x * sum scale
// * (q . q8) - dmin_w * d_x * sum min * (the q8 sums of its 32).
template <typename CodesOfHalf>
[[gnu::always_inline]] inline float32x4_t q4_k_block_dot(const uint8_t* d, const uint8_t* dmin,
                                                         const uint8_t* packed_scales,
                                                         CodesOfHalf codes_of, const BlockQ8_K& x,
                                                         float32x4_t acc) {
  uint8_t scales_mins[16];
  kquant::q4_k_scales_mins(packed_scales, scales_mins);
  const kquant::Int32x16 wide = kquant::widen_u8(vld1q_u8(scales_mins));
  const int16x8_t mins = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(scales_mins + 8)));
  const int16x8_t sums_32 = vpaddq_s16(vld1q_s16(x.bsums), vld1q_s16(x.bsums + 8));
  const int32x4_t min_dot = vmlal_s16(vmull_s16(vget_low_s16(mins), vget_low_s16(sums_32)),
                                      vget_high_s16(mins), vget_high_s16(sums_32));
  const int32x4_t dot = kquant::scaled_dot_32(wide.v, codes_of, x.qs);
  acc = vfmaq_n_f32(acc, vcvtq_f32_s32(dot), x.d * kquant::fp16_value(d));
  return vfmsq_n_f32(acc, vcvtq_f32_s32(min_dot), x.d * kquant::fp16_value(dmin));
}

// Writes one Q4_K/Q5_K block's values, as gguf computes them ((d * scale)
// * q rounded, then - dmin * min).
template <typename CodesOfHalf>
[[gnu::always_inline]] inline void q4_k_write_block(const uint8_t* d16, const uint8_t* dmin16,
                                                    const uint8_t* packed_scales,
                                                    CodesOfHalf codes_of, float* y) {
  const float d = kquant::fp16_value(d16), dmin = kquant::fp16_value(dmin16);
  uint8_t scales_mins[16];
  kquant::q4_k_scales_mins(packed_scales, scales_mins);
  float scales[16], offsets[16];  // per 16 elements
  for (int j = 0; j < 16; ++j) {
    scales[j] = d * static_cast<float>(scales_mins[j / 2]);
    offsets[j] = dmin * static_cast<float>(scales_mins[8 + j / 2]);
  }
  kquant::write_scaled_minus(scales, offsets, codes_of, y);
}

// A row of Q4_K blocks to float32, as gguf computes it.
void dequantize_row_q4_k(const uint8_t* src, float* y, int64_t n) {
  const kquant::Q4K* blocks = reinterpret_cast<const kquant::Q4K*>(src);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    const kquant::Q4K& b = blocks[i];
    q4_k_write_block(
        b.d, b.dmin, b.scales, [&](int half, int8x16_t* codes) { q4_k_codes(b.qs, half, codes); },
        y);
  }
}

// Q4_K row . q8_K row (the portable kernel's sums, in vector lanes).
float vec_dot_q4_k(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::Q4K* blocks = reinterpret_cast<const kquant::Q4K*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float32x4_t acc = vdupq_n_f32(0.0f);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    const kquant::Q4K& b = blocks[i];
    acc = q4_k_block_dot(
        b.d, b.dmin, b.scales, [&](int half, int8x16_t* codes) { q4_k_codes(b.qs, half, codes); },
        x[i], acc);
  }
  return vaddvq_f32(acc);
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
