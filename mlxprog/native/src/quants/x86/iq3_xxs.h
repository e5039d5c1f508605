// x86 IQ3_XXS (AVX2): the dot product with q8_K activations and the int8
// unpacker (portable/iq3_xxs.h has the layout; its row dequantizer is the
// portable one).
#pragma once

#include "iq_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The 32 weights ib of an IQ3_XXS block: eight 4-byte grid rows, the 32
// sign bits of four 7-bit sign indices, 2s + 1 for both 16s.
[[gnu::always_inline]] inline iq_x86::Group32 iq3_xxs_group(const uint8_t* grid,
                                                           const uint8_t* block, int ib) {
  using namespace iq_x86;
  const uint32_t meta = load_u32(block + 66 + 4 * ib);
  const int scale = xxs_scale(meta);
  return {rows_of_4(grid, bytes_8(block + 2 + 8 * ib)), sign_bytes(even_signs_32(meta)), scale,
          scale};
}

// IQ3_XXS's dot product and int8 unpacker.
using Iq3XxsKernels =
    iq_x86::GridKernels<Codebook::iq3xxs, kIq3xxsBytes, iq3_xxs_group, iq_x86::leading_d, 4>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
