// x86 TQ2_0 (AVX2): its code vectors, from which iq_x86::TernaryKernels
// makes the dot product with q8_K activations and the int8 unpacker
// (portable/tq2_0.h has the layout; its row dequantizer is the portable
// one). Bits 2j of the 32 bytes of half g are the codes of the 32
// consecutive weights 128g + 32j: one shift and mask a vector. The block's
// integer sums and unpacked codes are the portable kernels'.
#pragma once

#include "iq_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace tq2_x86 {

// TQ2_0's code vectors: each(k, codes) for the eight vectors of a block's
// codes (0 to 3), codes holding those of weights k to k + 31.
struct Vectors {
  template <class Each>
  [[gnu::always_inline]] static void visit(const uint8_t* block, Each each) {
    const __m256i two_bits = _mm256_set1_epi8(3);
    for (int g = 0; g < 2; ++g) {
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * g));
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j)
        each(128 * g + 32 * j, _mm256_and_si256(_mm256_srli_epi16(packed, 2 * j), two_bits));
    }
  }
};

}  // namespace tq2_x86

// TQ2_0's dot product and int8 unpacker.
using Tq2Kernels = iq_x86::TernaryKernels<kTq2Bytes, kTq2DOffset, tq2_x86::Vectors>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
