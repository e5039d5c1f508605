// arm TQ1_0 (NEON): its digit vectors, from which iq_arm::TernaryKernels
// makes the dot product with q8_K activations and the int8 unpacker
// (portable/tq1_0.h has the layout; its row dequantizer is the portable
// one). Digit j of a packed byte is the top base-3 digit of byte * 3^j mod
// 256: a byte multiply (which wraps) and the high byte of a widening
// multiply by 3.
#pragma once

#include "iq_neon.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

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
    static constexpr uint8_t kLastPowers[16] = {1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27};
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

// TQ1_0's dot product and int8 unpacker.
using Tq1Kernels = iq_arm::TernaryKernels<kTq1Bytes, kTq1DOffset, tq1_arm::Vectors>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
