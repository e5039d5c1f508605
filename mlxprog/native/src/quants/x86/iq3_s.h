// x86 IQ3_S (AVX2): the dot product with q8_K activations and the int8
// unpacker (portable/iq3_s.h has the layout; its row dequantizer is the
// portable one).
#pragma once

#include "iq_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The 32 weights ib of an IQ3_S block: eight grid rows (iq3_s_index in
// lanes: bit k of the high byte moved to bit 8 of index k), four sign
// bytes, 1 + 2s for both 16s.
[[gnu::always_inline]] inline iq_x86::Group32 iq3_s_group(const uint8_t* grid,
                                                         const uint8_t* block, int ib) {
  using namespace iq_x86;
  const __m256i high =
      _mm256_and_si256(_mm256_sllv_epi32(_mm256_set1_epi32(block[66 + ib]),
                                         _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1)),
                       _mm256_set1_epi32(0x100));
  const int scale = iq3_s_scale(block, ib);
  return {rows_of_4(grid, _mm256_or_si256(bytes_8(block + 2 + 8 * ib), high)),
          sign_bytes(load_u32(block + 74 + 4 * ib)), scale, scale};
}

// IQ3_S's dot product and int8 unpacker.
using Iq3SKernels =
    iq_x86::GridKernels<Codebook::iq3s, kIq3sBytes, iq3_s_group, iq_x86::leading_d, 1>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
