// x86 IQ1_S (AVX2): the dot product with q8_K activations and the int8
// unpacker (portable/iq1_s.h has the layout; its row dequantizer is the
// portable one).
#pragma once

#include "iq_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The 32 weights ib of an IQ1_S block as codes 8 * grid +- 1 (the shift
// folded in, as the int8 unpacker does): four ternary grid rows
// (iq1_s_index in lanes), one shift sign, 2s + 1 for both 16s.
[[gnu::always_inline]] inline iq_x86::Group32 iq1_s_group(const uint8_t* grid,
                                                         const uint8_t* block, int ib) {
  using namespace iq_x86;
  const uint32_t high = load_u16(block + 34 + 2 * ib);
  const __m128i indices = _mm_or_si128(bytes_4(block + 2 + 4 * ib), high_bits_4(high, 3, 7));
  const int scale = static_cast<int>(2 * ((high >> 12) & 7) + 1);
  return shifted_group(rows_of_8(grid, indices), _mm256_set1_epi8(high & 0x8000 ? -1 : 1), scale,
                       scale);
}

// IQ1_S's dot product and int8 unpacker.
using Iq1SKernels =
    iq_x86::GridKernels<Codebook::iq1s, kIq1sBytes, iq1_s_group, iq_x86::leading_d, 8>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
