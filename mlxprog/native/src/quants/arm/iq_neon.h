// arm helpers the IQ grid and ternary types' kernels share (NEON with the
// dot-product extension): grid rows loaded into vectors, sign bits spread
// to byte masks, each type's 32 weights decoded into Group32, and the NEON
// operations (GridOps, TernaryOps, sdot) with which portable/iq_blocks.h's
// GridVectorKernels and TernaryVectorKernels walk the rows for the dot
// product with q8_K codes and for the int8 unpacker. Each block's
// integer sum is the portable kernel's (exact), so the dot products equal
// the portable ones but for the float products' contraction, and the
// unpacked bytes are the portable unpacker's.
#pragma once

#include "kquant_neon.h"
#include "../portable/iq_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace iq_arm {

// 32 weights of a block decoded: their signed codes, 16 a vector, and the
// odd integer scales of the two 16s.
struct Group32 {
  int8x16_t codes[2];
  int low_scale, high_scale;
};

// Two vectors of grid rows: 32 weights' magnitudes or ternary values.
struct Rows {
  int8x16_t v[2];
};

// The 8-byte grid rows of four indices (rows 0 and 1, rows 2 and 3).
[[gnu::always_inline]] inline Rows rows_of_8(const uint8_t* grid, const uint32_t index[4]) {
  Rows rows;
  for (int v = 0; v < 2; ++v)
    rows.v[v] = vreinterpretq_s8_u8(
        vcombine_u8(vld1_u8(grid + 8 * index[2 * v]), vld1_u8(grid + 8 * index[2 * v + 1])));
  return rows;
}

// The 4-byte grid rows of eight indices (rows 0-3, rows 4-7).
[[gnu::always_inline]] inline Rows rows_of_4(const uint8_t* grid, const uint32_t index[8]) {
  Rows rows;
  for (int v = 0; v < 2; ++v) {
    uint32_t four[4];
    for (int k = 0; k < 4; ++k) four[k] = load_u32(grid + 4 * index[4 * v + k]);
    rows.v[v] = vreinterpretq_s8_u32(vld1q_u32(four));
  }
  return rows;
}

// The group of grid rows `rows` with element j negated where bit j of
// `signs` is set, and its two scales.
[[gnu::always_inline]] inline Group32 signed_group(Rows rows, uint32_t signs, int low_scale,
                                                   int high_scale) {
  static constexpr uint8_t kBits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t bit = vld1q_u8(kBits);
  Group32 g{{}, low_scale, high_scale};
  for (int v = 0; v < 2; ++v) {
    const uint8x16_t spread = vcombine_u8(vdup_n_u8(static_cast<uint8_t>(signs >> (16 * v))),
                                          vdup_n_u8(static_cast<uint8_t>(signs >> (16 * v + 8))));
    g.codes[v] = vbslq_s8(vtstq_u8(spread, bit), vnegq_s8(rows.v[v]), rows.v[v]);
  }
  return g;
}

// An IQ1 group's codes 8 * grid + shift (the ternary grid rows -1/0/1; the
// shift +-1 per 8 weights, negative[l] for row l's -1) and its two scales.
[[gnu::always_inline]] inline Group32 shifted_group(Rows rows, const bool negative[4],
                                                    int low_scale, int high_scale) {
  Group32 g{{}, low_scale, high_scale};
  for (int v = 0; v < 2; ++v) {
    const int8x16_t shifts =
        vcombine_s8(vdup_n_s8(negative[2 * v] ? -1 : 1), vdup_n_s8(negative[2 * v + 1] ? -1 : 1));
    g.codes[v] = vaddq_s8(vshlq_n_s8(rows.v[v], 3), shifts);
  }
  return g;
}

// The fp16 d at the start of a block (every grid type but IQ1_M).
[[gnu::always_inline]] inline float leading_d(const uint8_t* block) {
  return kquant::fp16_value(block);
}

// The NEON operations of the grid types' GridVectorKernels: per 16
// weights one sdot of the signed codes with the q8 codes, multiplied by
// the 16's scale into the block's accumulator.
struct GridOps {
  template <class Group>
  [[gnu::always_inline]] static int32_t block_dot(Group group, const int8_t* q8) {
    int32x4_t dot = vdupq_n_s32(0);
#pragma GCC unroll 8
    for (int ib = 0; ib < 8; ++ib) {
      const Group32 g = group(ib);
      const int8_t* q = q8 + 32 * ib;
      dot = vmlaq_n_s32(dot, kquant::dot_16(vdupq_n_s32(0), g.codes[0], q), g.low_scale);
      dot = vmlaq_n_s32(dot, kquant::dot_16(vdupq_n_s32(0), g.codes[1], q + 16), g.high_scale);
    }
    return vaddvq_s32(dot);
  }
  [[gnu::always_inline]] static void store_codes(const Group32& g, int8_t* out) {
    vst1q_s8(out, g.codes[0]);
    vst1q_s8(out + 16, g.codes[1]);
  }
};

// One grid type's kernels (see GridVectorKernels).
template <Codebook Book, int BlockBytes, Group32 (*Group)(const uint8_t*, const uint8_t*, int),
          float (*D)(const uint8_t*), int Divisor>
using GridKernels = GridVectorKernels<Book, BlockBytes, Group32, Group, D, Divisor, GridOps>;

// The NEON operations of the ternary types' TernaryVectorKernels (16 codes
// a vector).
struct TernaryOps {
  static int32x4_t zero() { return vdupq_n_s32(0); }
  [[gnu::always_inline]] static int32x4_t dot(int32x4_t acc, uint8x16_t codes, const int8_t* q8) {
    return kquant::dot_16(acc, vreinterpretq_s8_u8(codes), q8);
  }
  static int32_t total(int32x4_t acc) { return vaddvq_s32(acc); }
  [[gnu::always_inline]] static void store_minus_one(uint8x16_t codes, int8_t* out) {
    vst1q_s8(out, vsubq_s8(vreinterpretq_s8_u8(codes), vdupq_n_s8(1)));
  }
  static float fp16(const uint8_t* p) { return kquant::fp16_value(p); }
};

// A ternary type's kernels (TQ1_0, TQ2_0) from its code vectors (16 a
// vector).
template <int kBytes, int kDOffset, class Vectors>
using TernaryKernels = TernaryVectorKernels<kBytes, kDOffset, Vectors, TernaryOps>;

}  // namespace iq_arm
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
