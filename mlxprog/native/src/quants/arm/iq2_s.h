// arm IQ2_S (see portable/iq2_s.h): per 32 weights, four 10-bit grid
// indices (bytes and 2 high bits), 32 sign bits and two 4-bit scales.
#pragma once

#include "iq_neon.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A block's 32 weights ib.
[[gnu::always_inline]] inline iq_arm::Group32 iq2_s_group(const uint8_t* grid, const uint8_t* block,
                                                          int ib) {
  uint32_t index[4];
  for (int l = 0; l < 4; ++l) index[l] = iq2_s_index(block, 4 * ib + l);
  return iq_arm::signed_group(iq_arm::rows_of_8(grid, index), load_u32(block + 34 + 4 * ib),
                              nibble_scale(block + 74, 2 * ib),
                              nibble_scale(block + 74, 2 * ib + 1));
}

// IQ2_S's dot product and int8 unpacker.
using Iq2SKernels =
    iq_arm::GridKernels<Codebook::iq2s, kIq2sBytes, iq2_s_group, iq_arm::leading_d, 8>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
