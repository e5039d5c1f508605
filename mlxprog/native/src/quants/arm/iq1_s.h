// arm IQ1_S (see portable/iq1_s.h): per 32 weights, four 11-bit indices of
// ternary grid rows (bytes, and 3 high bits each in a uint16 that also
// holds the scale and the sign of the shift).
#pragma once

#include "iq_neon.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A block's 32 weights ib: codes 8 * grid +- 1.
[[gnu::always_inline]] inline iq_arm::Group32 iq1_s_group(const uint8_t* grid, const uint8_t* block,
                                                          int ib) {
  const uint32_t high = load_u16(block + 34 + 2 * ib);
  uint32_t index[4];
  for (int l = 0; l < 4; ++l) index[l] = iq1_s_index(block + 2 + 4 * ib, high, l);
  const bool negative = high & 0x8000;
  const bool shifts[4] = {negative, negative, negative, negative};
  const int scale = static_cast<int>(2 * ((high >> 12) & 7) + 1);
  return iq_arm::shifted_group(iq_arm::rows_of_8(grid, index), shifts, scale, scale);
}

// IQ1_S's dot product and int8 unpacker.
using Iq1SKernels =
    iq_arm::GridKernels<Codebook::iq1s, kIq1sBytes, iq1_s_group, iq_arm::leading_d, 8>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
