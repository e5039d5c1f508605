// arm IQ2_XS (see portable/iq2_xs.h): per 32 weights, four uint16 of a
// 9-bit grid index and a 7-bit sign index; a byte of two 4-bit scales.
#pragma once

#include "iq_neon.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A block's 32 weights ib.
[[gnu::always_inline]] inline iq_arm::Group32 iq2_xs_group(const uint8_t* grid,
                                                           const uint8_t* block, int ib) {
  const uint8_t* codes = block + 2 + 8 * ib;
  uint32_t index[4], signs = 0;
  for (int l = 0; l < 4; ++l) {
    const uint32_t code = load_u16(codes + 2 * l);
    index[l] = code & 511;
    signs |= static_cast<uint32_t>(kEvenSigns.bits[code >> 9]) << (8 * l);
  }
  return iq_arm::signed_group(iq_arm::rows_of_8(grid, index), signs,
                              nibble_scale(block + 66, 2 * ib),
                              nibble_scale(block + 66, 2 * ib + 1));
}

// IQ2_XS's dot product and int8 unpacker.
using Iq2XsKernels =
    iq_arm::GridKernels<Codebook::iq2xs, kIq2xsBytes, iq2_xs_group, iq_arm::leading_d, 8>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
