// arm TQ2_0 (NEON): its code vectors, from which iq_arm::TernaryKernels
// makes the dot product with q8_K activations and the int8 unpacker
// (portable/tq2_0.h has the layout; its row dequantizer is the portable
// one): one shift and mask a vector.
#pragma once

#include "iq_neon.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

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

// TQ2_0's dot product and int8 unpacker.
using Tq2Kernels = iq_arm::TernaryKernels<kTq2Bytes, kTq2DOffset, tq2_arm::Vectors>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
