// arm helpers the K-quant and IQ4_XS kernels share (NEON with the
// dot-product extension). A block's codes are int8x16 vectors of 16
// consecutive elements; vdotq_s32 multiplies them with the q8 codes into
// four int32 partial sums per vector, which are added up per sub-block,
// weighted by the sub-block scales in int32 lanes, and multiply-added into
// float lanes once per block: one horizontal sum per row. The helpers are
// always inlined and their fixed loops unrolled (#pragma GCC unroll), so
// that the codes stay in registers.
#pragma once

#include "../portable/kquant_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace kquant {

// The fp16 at p as float (the base ARMv8 conversion: exact).
[[gnu::always_inline]] inline float fp16_value(const uint8_t* p) {
  __fp16 h;
  std::memcpy(&h, p, 2);
  return static_cast<float>(h);
}

// The four int32 partial sums of codes . the 16 q8 codes at q8, added to acc.
[[gnu::always_inline]] inline int32x4_t dot_16(int32x4_t acc, int8x16_t codes, const int8_t* q8) {
  return vdotq_s32(acc, codes, vld1q_s8(q8));
}

// The totals of four vectors of partial sums, one per lane.
[[gnu::always_inline]] inline int32x4_t totals_4(int32x4_t a, int32x4_t b, int32x4_t c,
                                                 int32x4_t d) {
  return vpaddq_s32(vpaddq_s32(a, b), vpaddq_s32(c, d));
}

// 16 unsigned bytes as four int32x4 (lanes 0-3, 4-7, 8-11, 12-15).
struct Int32x16 {
  int32x4_t v[4];
};
[[gnu::always_inline]] inline Int32x16 widen_u8(uint8x16_t bytes) {
  const uint16x8_t low = vmovl_u8(vget_low_u8(bytes)), high = vmovl_u8(vget_high_u8(bytes));
  return {{vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(low))),
           vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(low))),
           vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(high))),
           vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(high)))}};
}

// 16 signed bytes as four int32x4.
[[gnu::always_inline]] inline Int32x16 widen_s8(int8x16_t bytes) {
  const int16x8_t low = vmovl_s8(vget_low_s8(bytes)), high = vmovl_s8(vget_high_s8(bytes));
  return {{vmovl_s16(vget_low_s16(low)), vmovl_s16(vget_high_s16(low)),
           vmovl_s16(vget_low_s16(high)), vmovl_s16(vget_high_s16(high))}};
}

// sum_j scales[j] * sums[j] over 16 int16 pairs as four int32 partial sums
// (the q8 block sums weighted by per-16 scales or mins).
[[gnu::always_inline]] inline int32x4_t weighted_sums_16(int16x8_t scales_low,
                                                         int16x8_t scales_high,
                                                         const int16_t* sums) {
  const int16x8_t sums_low = vld1q_s16(sums), sums_high = vld1q_s16(sums + 8);
  int32x4_t acc = vmull_s16(vget_low_s16(scales_low), vget_low_s16(sums_low));
  acc = vmlal_s16(acc, vget_high_s16(scales_low), vget_high_s16(sums_low));
  acc = vmlal_s16(acc, vget_low_s16(scales_high), vget_low_s16(sums_high));
  return vmlal_s16(acc, vget_high_s16(scales_high), vget_high_s16(sums_high));
}

// v itself, opaque to the compiler: products stay rounded to float before a
// subtraction (no FMA contraction, which gguf's numpy does not do).
[[gnu::always_inline]] inline float32x4_t rounded_f32(float32x4_t v) {
  __asm__("" : "+w"(v));
  return v;
}

// 16 int8 codes as four float32x4.
struct Floats16 {
  float32x4_t v[4];
};
[[gnu::always_inline]] inline Floats16 codes_to_floats(int8x16_t codes) {
  const Int32x16 wide = widen_s8(codes);
  return {{vcvtq_f32_s32(wide.v[0]), vcvtq_f32_s32(wide.v[1]), vcvtq_f32_s32(wide.v[2]),
           vcvtq_f32_s32(wide.v[3])}};
}

// y[0..16) = scale * codes (one float rounding each, as gguf).
[[gnu::always_inline]] inline void store_scaled_16(float* y, int8x16_t codes, float scale) {
  const Floats16 f = codes_to_floats(codes);
#pragma GCC unroll 16
  for (int k = 0; k < 4; ++k) vst1q_f32(y + 4 * k, vmulq_n_f32(f.v[k], scale));
}

// y[0..16) = scale * codes - offset, the product rounded first (gguf's
// order).
[[gnu::always_inline]] inline void store_scaled_minus_16(float* y, int8x16_t codes, float scale,
                                                         float offset) {
  const Floats16 f = codes_to_floats(codes);
  const float32x4_t offsets = vdupq_n_f32(offset);
#pragma GCC unroll 16
  for (int k = 0; k < 4; ++k)
    vst1q_f32(y + 4 * k, vsubq_f32(rounded_f32(vmulq_n_f32(f.v[k], scale)), offsets));
}

// A block's codes half by half: codes_of(half, codes) writes elements
// 128 * half + 16j.. as codes[j], j < 8. Taking them half a block at a time
// keeps them in registers.

// sum over a block of scale * (codes . q8) as four int32 partial sums, for
// the types with a scale per 16 (scales: the 16 as int32).
template <typename CodesOfHalf>
[[gnu::always_inline]] inline int32x4_t scaled_dot_16(const Int32x16& scales, CodesOfHalf codes_of,
                                                      const int8_t* q8) {
  const int32x4_t zero = vdupq_n_s32(0);
  int32x4_t dot = zero;
#pragma GCC unroll 16
  for (int half = 0; half < 2; ++half) {
    int8x16_t codes[8];
    codes_of(half, codes);
    int32x4_t partial[8];
#pragma GCC unroll 16
    for (int j = 0; j < 8; ++j) partial[j] = dot_16(zero, codes[j], q8 + 128 * half + 16 * j);
    dot = vmlaq_s32(dot, totals_4(partial[0], partial[1], partial[2], partial[3]),
                    scales.v[2 * half]);
    dot = vmlaq_s32(dot, totals_4(partial[4], partial[5], partial[6], partial[7]),
                    scales.v[2 * half + 1]);
  }
  return dot;
}

// The same for the types with a scale per 32 (scales: the 8 as int32,
// sub-blocks 0-3 and 4-7).
template <typename CodesOfHalf>
[[gnu::always_inline]] inline int32x4_t scaled_dot_32(const int32x4_t scales[2],
                                                      CodesOfHalf codes_of, const int8_t* q8) {
  const int32x4_t zero = vdupq_n_s32(0);
  int32x4_t dot = zero;
#pragma GCC unroll 16
  for (int half = 0; half < 2; ++half) {
    int8x16_t codes[8];
    codes_of(half, codes);
    int32x4_t partial[4];
#pragma GCC unroll 16
    for (int j = 0; j < 4; ++j) {
      const int8_t* q = q8 + 128 * half + 32 * j;
      partial[j] = dot_16(dot_16(zero, codes[2 * j], q), codes[2 * j + 1], q + 16);
    }
    dot = vmlaq_s32(dot, totals_4(partial[0], partial[1], partial[2], partial[3]), scales[half]);
  }
  return dot;
}

// Writes a block of values scale * code (scales[j]: elements 16j..16j+15).
template <typename CodesOfHalf>
[[gnu::always_inline]] inline void write_scaled(const float scales[16], CodesOfHalf codes_of,
                                                float* y) {
#pragma GCC unroll 16
  for (int half = 0; half < 2; ++half) {
    int8x16_t codes[8];
    codes_of(half, codes);
#pragma GCC unroll 16
    for (int j = 0; j < 8; ++j)
      store_scaled_16(y + 128 * half + 16 * j, codes[j], scales[8 * half + j]);
  }
}

// Writes a block of values scale * code - offset (per 16 as write_scaled).
template <typename CodesOfHalf>
[[gnu::always_inline]] inline void write_scaled_minus(const float scales[16],
                                                      const float offsets[16], CodesOfHalf codes_of,
                                                      float* y) {
#pragma GCC unroll 16
  for (int half = 0; half < 2; ++half) {
    int8x16_t codes[8];
    codes_of(half, codes);
#pragma GCC unroll 16
    for (int j = 0; j < 8; ++j)
      store_scaled_minus_16(y + 128 * half + 16 * j, codes[j], scales[8 * half + j],
                            offsets[8 * half + j]);
  }
}

// The bytes of v as int8 (codes below 128).
[[gnu::always_inline]] inline int8x16_t as_s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

}  // namespace kquant
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
