// arm IQ3_XXS (see portable/iq3_xxs.h): per 32 weights, eight bytes of
// 4-byte grid rows; a uint32 of four 7-bit sign indices and the scale.
#pragma once

#include "iq_neon.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A block's 32 weights ib.
[[gnu::always_inline]] inline iq_arm::Group32 iq3_xxs_group(const uint8_t* grid,
                                                            const uint8_t* block, int ib) {
  uint32_t index[8];
  for (int k = 0; k < 8; ++k) index[k] = block[2 + 8 * ib + k];
  const uint32_t meta = load_u32(block + 66 + 4 * ib);
  const int scale = xxs_scale(meta);
  return iq_arm::signed_group(iq_arm::rows_of_4(grid, index), even_signs_32(meta), scale, scale);
}

// IQ3_XXS's dot product and int8 unpacker.
using Iq3XxsKernels =
    iq_arm::GridKernels<Codebook::iq3xxs, kIq3xxsBytes, iq3_xxs_group, iq_arm::leading_d, 4>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
