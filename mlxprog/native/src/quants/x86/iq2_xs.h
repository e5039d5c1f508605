// x86 IQ2_XS (AVX2): the dot product with q8_K activations and the int8
// unpacker (portable/iq2_xs.h has the layout; its row dequantizer is the
// portable one).
#pragma once

#include "iq_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The 32 weights ib of an IQ2_XS block: four uint16 (a 9-bit grid index and
// a 7-bit sign index each), each 16's 2s + 1.
[[gnu::always_inline]] inline iq_x86::Group32 iq2_xs_group(const uint8_t* grid,
                                                          const uint8_t* block, int ib) {
  using namespace iq_x86;
  const uint8_t* codes = block + 2 + 8 * ib;
  uint32_t signs = 0;
  for (int l = 0; l < 4; ++l)
    signs |= static_cast<uint32_t>(kEvenSigns.bits[load_u16(codes + 2 * l) >> 9]) << (8 * l);
  const __m128i indices = _mm_and_si128(
      _mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes))),
      _mm_set1_epi32(511));
  return {rows_of_8(grid, indices), sign_bytes(signs), nibble_scale(block + 66, 2 * ib),
          nibble_scale(block + 66, 2 * ib + 1)};
}

// IQ2_XS's dot product and int8 unpacker.
using Iq2XsKernels =
    iq_x86::GridKernels<Codebook::iq2xs, kIq2xsBytes, iq2_xs_group, iq_x86::leading_d, 8>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
