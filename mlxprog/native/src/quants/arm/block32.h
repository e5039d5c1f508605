// arm: what the 32-element block types share (NEON with the dot-product
// extension). A block's 32 codes are two int8x16 vectors (elements 0-15,
// 16-31); their dot with the q8 block is two vdotq_s32 into four int32
// partial sums, converted once and multiply-added with the block's scale
// into float accumulators: one horizontal sum per row.
#pragma once

#include "../portable/block32.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
// Names live in the nested namespace `block32`: other groups' helpers share
// the enclosing namespace in the same table file.
namespace block32 {

// A block's 32 codes: elements 0-15 and 16-31.
struct Codes32 {
  int8x16_t low, high;
};

// The little-endian fp16 at p as float (the base ARMv8 conversion).
inline float fp16_scale(const uint8_t* p) {
  __fp16 h;
  std::memcpy(&h, p, 2);
  return static_cast<float>(h);
}

// The 32 4-bit codes of the 16 bytes at p, as bytes 0..15.
inline Codes32 nibbles_32(const uint8_t* p) {
  const uint8x16_t packed = vld1q_u8(p);
  return {vreinterpretq_s8_u8(vandq_u8(packed, vdupq_n_u8(0x0F))),
          vreinterpretq_s8_u8(vshrq_n_u8(packed, 4))};
}

// The 32 bits of the little-endian uint32 at p as two vectors of 16 bytes:
// byte j is 0xFF where bit j is set (byte j takes byte j / 8 of the word,
// then tests bit j % 8).
inline void bits_to_bytes_32(const uint8_t* p, uint8x16_t& low, uint8x16_t& high) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const uint8x16_t word = vreinterpretq_u8_u32(vdupq_n_u32(bits));
  const uint8x16_t bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ull));
  const uint8x16_t bytes_01 =
      vreinterpretq_u8_u64(vcombine_u64(vcreate_u64(0), vcreate_u64(0x0101010101010101ull)));
  const uint8x16_t bytes_23 = vaddq_u8(bytes_01, vdupq_n_u8(2));
  low = vtstq_u8(vqtbl1q_u8(word, bytes_01), bit);
  high = vtstq_u8(vqtbl1q_u8(word, bytes_23), bit);
}

// v with `value` or-ed into byte j where bit j of the little-endian uint32
// at p is set (where_set) or clear (!where_set): the fifth bits of Q5_0 and
// Q5_1.
template <bool where_set>
inline Codes32 or_where_bits(Codes32 v, const uint8_t* p, uint8_t value) {
  uint8x16_t low, high;
  bits_to_bytes_32(p, low, high);
  const uint8x16_t fill = vdupq_n_u8(value);
  const uint8x16_t add_low = where_set ? vandq_u8(low, fill) : vbicq_u8(fill, low);
  const uint8x16_t add_high = where_set ? vandq_u8(high, fill) : vbicq_u8(fill, high);
  return {vreinterpretq_s8_u8(vorrq_u8(vreinterpretq_u8_s8(v.low), add_low)),
          vreinterpretq_s8_u8(vorrq_u8(vreinterpretq_u8_s8(v.high), add_high))};
}

// The 16-entry int8 table `values` looked up at each code.
inline Codes32 lookup_16(const int8_t* values, Codes32 codes) {
  const int8x16_t table = vld1q_s8(values);
  return {vqtbl1q_s8(table, vreinterpretq_u8_s8(codes.low)),
          vqtbl1q_s8(table, vreinterpretq_u8_s8(codes.high))};
}

// The four int32 partial sums of codes . the 32 q8 codes at q8.
inline int32x4_t dot_codes_32(Codes32 codes, const int8_t* q8) {
  const int32x4_t low = vdotq_s32(vdupq_n_s32(0), codes.low, vld1q_s8(q8));
  return vdotq_s32(low, codes.high, vld1q_s8(q8 + 16));
}

// p itself, but opaque to the compiler, so that a product passed through
// here is rounded before a later add instead of fused into an FMA (gguf
// rounds d * q, then adds m).
inline float32x4_t rounded_product(float32x4_t p) {
  __asm__("" : "+w"(p));
  return p;
}

// Writes 16 int8 codes times d (x4 per store) to y, plus m when with_min
// (d * code rounded first), as gguf computes it.
template <bool with_min>
inline void store_scaled_16(int8x16_t codes, float d, float m, float* y) {
  const int16x8_t halves[2] = {vmovl_s8(vget_low_s8(codes)), vmovl_s8(vget_high_s8(codes))};
  for (int h = 0; h < 2; ++h) {
    const int32x4_t quarters[2] = {vmovl_s16(vget_low_s16(halves[h])),
                                   vmovl_s16(vget_high_s16(halves[h]))};
    for (int q = 0; q < 2; ++q) {
      const float32x4_t product = vmulq_n_f32(vcvtq_f32_s32(quarters[q]), d);
      vst1q_f32(y + 8 * h + 4 * q,
                with_min ? vaddq_f32(rounded_product(product), vdupq_n_f32(m)) : product);
    }
  }
}

// A row of blocks of kBytes to float32: codes(block) the 32 signed codes,
// scale(block) the float they are multiplied by.
template <int kBytes, typename CodesOf, typename Scale>
inline void dequantize_blocks(const uint8_t* src, float* y, int64_t n, CodesOf codes, Scale scale) {
  for (int64_t i = 0; i < n / kBlock32; ++i, src += kBytes, y += kBlock32) {
    const Codes32 c = codes(src);
    const float d = scale(src);
    store_scaled_16<false>(c.low, d, 0.0f, y);
    store_scaled_16<false>(c.high, d, 0.0f, y + 16);
  }
}

// A row of blocks w = d * q + m (Q4_1, Q5_1) to float32: codes(block)
// gives q, the fp16 d and m are at the block's start.
template <int kBytes, typename CodesOf>
inline void dequantize_blocks_with_min(const uint8_t* src, float* y, int64_t n, CodesOf codes) {
  for (int64_t i = 0; i < n / kBlock32; ++i, src += kBytes, y += kBlock32) {
    const Codes32 c = codes(src);
    const float d = fp16_scale(src), m = fp16_scale(src + 2);
    store_scaled_16<true>(c.low, d, m, y);
    store_scaled_16<true>(c.high, d, m, y + 16);
  }
}

// A row's dot product with q8_0 blocks: per block the signed dot of
// codes(block) with the q8 codes, scaled by scale(block) * d_x. Two blocks
// a step into two accumulators.
template <int kBytes, typename CodesOf, typename Scale>
inline float dot_blocks_q8_0(int64_t n, const uint8_t* w, const BlockQ8_0* x, CodesOf codes,
                             Scale scale) {
  const int64_t blocks = n / kBlock32;
  float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
  int64_t i = 0;
  for (; i + 1 < blocks; i += 2, w += 2 * kBytes) {
    const int32x4_t dot0 = dot_codes_32(codes(w), x[i].qs);
    const int32x4_t dot1 = dot_codes_32(codes(w + kBytes), x[i + 1].qs);
    acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(dot0), scale(w) * x[i].d);
    acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(dot1), scale(w + kBytes) * x[i + 1].d);
  }
  if (i < blocks)
    acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(dot_codes_32(codes(w), x[i].qs)), scale(w) * x[i].d);
  return vaddvq_f32(vaddq_f32(acc0, acc1));
}

// A row's dot product with q8_1 blocks for w = d * q + m (Q4_1, Q5_1): per
// block d * d_x * (q . q8) plus m * s_x, the minimum times the q8_1 block's
// sum. codes(block) gives q, the fp16 d and m are at the block's start.
template <int kBytes, typename CodesOf>
inline float dot_blocks_q8_1(int64_t n, const uint8_t* w, const BlockQ8_1* x, CodesOf codes) {
  const int64_t blocks = n / kBlock32;
  float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
  float minima = 0.0f;
  int64_t i = 0;
  for (; i + 1 < blocks; i += 2, w += 2 * kBytes) {
    const int32x4_t dot0 = dot_codes_32(codes(w), x[i].qs);
    const int32x4_t dot1 = dot_codes_32(codes(w + kBytes), x[i + 1].qs);
    acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(dot0), fp16_scale(w) * x[i].d);
    acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(dot1), fp16_scale(w + kBytes) * x[i + 1].d);
    minima += fp16_scale(w + 2) * x[i].s + fp16_scale(w + kBytes + 2) * x[i + 1].s;
  }
  if (i < blocks) {
    acc0 =
        vfmaq_n_f32(acc0, vcvtq_f32_s32(dot_codes_32(codes(w), x[i].qs)), fp16_scale(w) * x[i].d);
    minima += fp16_scale(w + 2) * x[i].s;
  }
  return vaddvq_f32(vaddq_f32(acc0, acc1)) + minima;
}

}  // namespace block32
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
