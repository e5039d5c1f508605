// x86 IQ1_M (AVX2): the dot product with q8_K activations and the int8
// unpacker (portable/iq1_m.h has the layout; its row dequantizer is the
// portable one).
#pragma once

#include "iq_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The 32 weights ib of an IQ1_M block as codes 8 * grid +- 1 (each 8's
// shift folded in): four 4-bit fields (iq1_m_index in lanes: low bytes,
// the fields' 3-bit highs; each 8's shift -1 where bit 3 is set), each
// 16's 2s + 1.
[[gnu::always_inline]] inline iq_x86::Group32 iq1_m_group(const uint8_t* grid,
                                                         const uint8_t* block, int ib) {
  using namespace iq_x86;
  const uint32_t fields = load_u16(block + 32 + 2 * ib);
  const __m128i indices = _mm_or_si128(bytes_4(block + 4 * ib), high_bits_4(fields, 4, 7));
  int64_t shifts[4];
  for (int l = 0; l < 4; ++l) shifts[l] = (fields >> (4 * l)) & 8 ? -1 : 0x0101010101010101;
  return shifted_group(rows_of_8(grid, indices),
                       _mm256_set_epi64x(shifts[3], shifts[2], shifts[1], shifts[0]),
                       iq1_m_scale(block, 2 * ib), iq1_m_scale(block, 2 * ib + 1));
}

// IQ1_M's dot product and int8 unpacker.
using Iq1MKernels = iq_x86::GridKernels<Codebook::iq1s, kIq1mBytes, iq1_m_group, iq1_m_d, 8>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
