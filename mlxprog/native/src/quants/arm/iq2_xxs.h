// arm IQ2_XXS (see portable/iq2_xxs.h): per 32 weights, four bytes of
// 8-byte grid rows, then a uint32 of four 7-bit sign indices and the scale.
#pragma once

#include "iq_neon.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A block's 32 weights ib.
[[gnu::always_inline]] inline iq_arm::Group32 iq2_xxs_group(const uint8_t* grid,
                                                            const uint8_t* block, int ib) {
  const uint8_t* indices = block + 2 + 8 * ib;
  const uint32_t meta = load_u32(indices + 4);
  const uint32_t index[4] = {indices[0], indices[1], indices[2], indices[3]};
  const int scale = xxs_scale(meta);
  return iq_arm::signed_group(iq_arm::rows_of_8(grid, index), even_signs_32(meta), scale, scale);
}

// IQ2_XXS's dot product and int8 unpacker.
using Iq2XxsKernels =
    iq_arm::GridKernels<Codebook::iq2xxs, kIq2xxsBytes, iq2_xxs_group, iq_arm::leading_d, 8>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
