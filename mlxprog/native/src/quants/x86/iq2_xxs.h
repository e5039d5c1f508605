// x86 IQ2_XXS (AVX2): the dot product with q8_K activations and the int8
// unpacker (portable/iq2_xxs.h has the layout; its row dequantizer is the
// portable one).
#pragma once

#include "iq_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The 32 weights ib of an IQ2_XXS block: four 8-byte grid rows, the 32
// sign bits of four 7-bit sign indices, 2s + 1 for both 16s.
[[gnu::always_inline]] inline iq_x86::Group32 iq2_xxs_group(const uint8_t* grid,
                                                           const uint8_t* block, int ib) {
  using namespace iq_x86;
  const uint8_t* indices = block + 2 + 8 * ib;
  const uint32_t meta = load_u32(indices + 4);
  const int scale = xxs_scale(meta);
  return {rows_of_8(grid, bytes_4(indices)), sign_bytes(even_signs_32(meta)), scale, scale};
}

// IQ2_XXS's dot product and int8 unpacker.
using Iq2XxsKernels =
    iq_x86::GridKernels<Codebook::iq2xxs, kIq2xxsBytes, iq2_xxs_group, iq_x86::leading_d, 8>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
