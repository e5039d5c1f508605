// arm IQ3_S (see portable/iq3_s.h): per 32 weights, eight 9-bit grid
// indices of 4-byte rows (bytes and a high bit each), 32 sign bits, and a
// 4-bit scale.
#pragma once

#include "iq_neon.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A block's 32 weights ib.
[[gnu::always_inline]] inline iq_arm::Group32 iq3_s_group(const uint8_t* grid, const uint8_t* block,
                                                          int ib) {
  uint32_t index[8];
  for (int k = 0; k < 8; ++k) index[k] = iq3_s_index(block, 8 * ib + k);
  const int scale = iq3_s_scale(block, ib);
  return iq_arm::signed_group(iq_arm::rows_of_4(grid, index), load_u32(block + 74 + 4 * ib), scale,
                              scale);
}

// IQ3_S's dot product and int8 unpacker.
using Iq3SKernels =
    iq_arm::GridKernels<Codebook::iq3s, kIq3sBytes, iq3_s_group, iq_arm::leading_d, 1>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
