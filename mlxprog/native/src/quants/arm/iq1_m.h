// arm IQ1_M (see portable/iq1_m.h): per 32 weights, four 11-bit indices of
// ternary grid rows with a shift sign each, and two 3-bit scales; the
// block's d is spread over its scale words.
#pragma once

#include "iq_neon.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A block's 32 weights ib: codes 8 * grid +- 1.
[[gnu::always_inline]] inline iq_arm::Group32 iq1_m_group(const uint8_t* grid, const uint8_t* block,
                                                          int ib) {
  uint32_t index[4];
  bool shifts[4];
  for (int l = 0; l < 4; ++l) {
    index[l] = iq1_m_index(block, 4 * ib + l);
    shifts[l] = iq1_m_field(block, 4 * ib + l) & 8;
  }
  return iq_arm::shifted_group(iq_arm::rows_of_8(grid, index), shifts, iq1_m_scale(block, 2 * ib),
                               iq1_m_scale(block, 2 * ib + 1));
}

// IQ1_M's dot product and int8 unpacker.
using Iq1MKernels = iq_arm::GridKernels<Codebook::iq1s, kIq1mBytes, iq1_m_group, iq1_m_d, 8>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
