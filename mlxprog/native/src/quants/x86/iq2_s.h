// x86 IQ2_S (AVX2): the dot product with q8_K activations and the int8
// unpacker (portable/iq2_s.h has the layout; its row dequantizer is the
// portable one).
#pragma once

#include "iq_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The 32 weights ib of an IQ2_S block: four grid rows (iq2_s_index in
// lanes: low bytes, 2-bit highs), a sign byte each, each 16's 2s + 1.
[[gnu::always_inline]] inline iq_x86::Group32 iq2_s_group(const uint8_t* grid,
                                                         const uint8_t* block, int ib) {
  using namespace iq_x86;
  const __m128i indices =
      _mm_or_si128(bytes_4(block + 2 + 4 * ib), high_bits_4(block[66 + ib], 2, 3));
  return {rows_of_8(grid, indices), sign_bytes(load_u32(block + 34 + 4 * ib)),
          nibble_scale(block + 74, 2 * ib), nibble_scale(block + 74, 2 * ib + 1)};
}

// IQ2_S's dot product and int8 unpacker.
using Iq2SKernels =
    iq_x86::GridKernels<Codebook::iq2s, kIq2sBytes, iq2_s_group, iq_x86::leading_d, 8>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
