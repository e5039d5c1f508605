// arm: the ternary types TQ1_0 and TQ2_0 in NEON with the dot-product
// extension: each type gives its codes (0 to 2) 16 weights a vector, and
// iq_arm::TernaryKernels makes the dot product with q8_K activations
// (vdotq_s32) and the int8 unpacker from them (portable/tq1_0.h and
// tq2_0.h have the layouts; the row dequantizers are the portable ones).
// The block's integer sums and unpacked codes are the portable kernels'.
#pragma once

#include "kquant_neon.h"
#include "../portable/iq_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace iq_arm {

// A ternary type's dot product and int8 unpacker from Vectors::visit(block,
// each), which calls each(k, codes) for the 16 vectors of a block's codes
// (0 to 2), codes holding those of weights k to k + 15.
template <int kBytes, int kDOffset, class Vectors>
struct TernaryKernels {
  // A row . a q8_K row (dot_ternary_row).
  static float vec_dot(int64_t n, const uint8_t* w, const void* x) {
    return dot_ternary_row<kBytes, kDOffset>(
        n, w, x,
        [](const uint8_t* block, const int8_t* q8) {
          int32x4_t dot = vdupq_n_s32(0);
          Vectors::visit(block, [&](int k, uint8x16_t codes) {
            dot = kquant::dot_16(dot, vreinterpretq_s8_u8(codes), q8 + k);
          });
          return vaddvq_s32(dot);
        },
        kquant::fp16_value);
  }
  // A row in the int8 GEMM's form (unpack_ternary_row): the portable
  // unpacker's bytes.
  static void unpack_row(const uint8_t* src, void* dst, int64_t n) {
    unpack_ternary_row<kBytes, kDOffset>(
        src, dst, n,
        [](const uint8_t* block, int8_t* codes) {
          Vectors::visit(block, [&](int k, uint8x16_t q) {
            vst1q_s8(codes + k, vsubq_s8(vreinterpretq_s8_u8(q), vdupq_n_s8(1)));
          });
        },
        kquant::fp16_value);
  }
};

}  // namespace iq_arm

namespace tq1_arm {

// The top base-3 digit (0, 1 or 2) of each byte of bytes * pow3 (mod 256,
// as the byte multiply wraps): the high byte of t * 3.
[[gnu::always_inline]] inline uint8x16_t top_digits(uint8x16_t bytes, uint8x16_t pow3) {
  const uint8x16_t t = vmulq_u8(bytes, pow3);
  const uint8x8_t three = vdup_n_u8(3);
  return vuzp2q_u8(vreinterpretq_u8_u16(vmull_u8(vget_low_u8(t), three)),
                   vreinterpretq_u8_u16(vmull_high_u8(t, vdupq_n_u8(3))));
}

// TQ1_0's digit vectors: digit j of byte m of a span is the span's weight
// Bytes * j + m; the 4-byte span's four digits make one vector (digit j in
// bytes 4j to 4j + 3).
struct Vectors {
  template <class Each>
  [[gnu::always_inline]] static void visit(const uint8_t* block, Each each) {
    static constexpr uint8_t kPowers[5] = {1, 3, 9, 27, 81};
    static constexpr uint8_t kLastPowers[16] = {1, 1, 1, 1, 3, 3, 3, 3,
                                                9, 9, 9, 9, 27, 27, 27, 27};
    const uint8x16_t span32[2] = {vld1q_u8(block), vld1q_u8(block + 16)};
#pragma GCC unroll 5
    for (int j = 0; j < 5; ++j) {
      const uint8x16_t pow3 = vdupq_n_u8(kPowers[j]);
      each(32 * j, top_digits(span32[0], pow3));
      each(32 * j + 16, top_digits(span32[1], pow3));
    }
    const uint8x16_t span16 = vld1q_u8(block + 32);
#pragma GCC unroll 5
    for (int j = 0; j < 5; ++j) each(160 + 16 * j, top_digits(span16, vdupq_n_u8(kPowers[j])));
    const uint8x16_t last = vreinterpretq_u8_u32(vdupq_n_u32(load_u32(block + 48)));
    each(240, top_digits(last, vld1q_u8(kLastPowers)));
  }
};

}  // namespace tq1_arm

namespace tq2_arm {

// TQ2_0's code vectors: bits 2j of the 32 bytes of half g are the codes of
// weights 128g + 32j to 128g + 32j + 31, 16 bytes a vector.
struct Vectors {
  template <class Each>
  [[gnu::always_inline]] static void visit(const uint8_t* block, Each each) {
    const uint8x16_t two_bits = vdupq_n_u8(3);
#pragma GCC unroll 2
    for (int g = 0; g < 2; ++g) {
      const uint8x16_t packed[2] = {vld1q_u8(block + 32 * g), vld1q_u8(block + 32 * g + 16)};
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const int8x16_t right = vdupq_n_s8(static_cast<int8_t>(-2 * j));
        each(128 * g + 32 * j, vandq_u8(vshlq_u8(packed[0], right), two_bits));
        each(128 * g + 32 * j + 16, vandq_u8(vshlq_u8(packed[1], right), two_bits));
      }
    }
  }
};

}  // namespace tq2_arm

// The ternary types' dot products and int8 unpackers.
using Tq1Kernels = iq_arm::TernaryKernels<kTq1Bytes, kTq1DOffset, tq1_arm::Vectors>;
using Tq2Kernels = iq_arm::TernaryKernels<kTq2Bytes, kTq2DOffset, tq2_arm::Vectors>;

}  // namespace

// Registers the ternary types' q8_K dot products and int8 unpackers of
// signed codes (the row dequantizers resolve to the portable ones).
inline void add_ternary(QuantKernels& k) {
  k.types[static_cast<int>(Type::TQ1_0)] = {nullptr, Tq1Kernels::vec_dot, Tq1Kernels::unpack_row,
                                            true};
  k.types[static_cast<int>(Type::TQ2_0)] = {nullptr, Tq2Kernels::vec_dot, Tq2Kernels::unpack_row,
                                            true};
}

}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
