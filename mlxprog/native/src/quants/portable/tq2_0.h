// portable TQ2_0 (2.06 bits/weight, ternary): per 256, 64 bytes of 2-bit
// codes q in {0, 1, 2} (bits 2j of byte 32g + m hold weight 128g + 32j + m),
// then an fp16 d; w = d * (q - 1).
#pragma once

#include "iq_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// TQ2_0's weights: visit(k, q) for each of a block's 256 weights k and its
// code q.
struct Tq2Weights {
  template <class Visit>
  static void visit(const uint8_t* block, Visit each) {
    for (int g = 0; g < 2; ++g)
      for (int j = 0; j < 4; ++j)
        for (int m = 0; m < 32; ++m) each(128 * g + 32 * j + m, (block[32 * g + m] >> (2 * j)) & 3);
  }
};

// TQ2_0's row dequantizer, dot product and int8 unpacker.
using Tq2Kernels = TernaryKernels<kTq2Bytes, kTq2DOffset, Tq2Weights>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
