// x86 IQ2_XS (AVX2): the dot product with q8_K activations (the portable
// kernels dequantize and unpack; portable/iq2_xs.h has the layout).
#pragma once

#include "iq_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// IQ2_XS row . q8_K row: per 32, four 9-bit grid indices and 7-bit sign
// indices, each 16 weighted by its 2s + 1; the portable kernel's integer
// sums, one float product per block.
float vec_dot_iq2_xs(int64_t n, const uint8_t* w, const void* xv) {
  using namespace iq_x86;
  const uint8_t* grid = grid_bytes("iq2xs_grid");
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, w += kIq2xsBytes) {
    __m256i dot = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* codes = w + 2 + 8 * ib;  // four uint16: 9-bit index, 7-bit sign index
      uint32_t signs = 0;
      for (int l = 0; l < 4; ++l)
        signs |= static_cast<uint32_t>(kEvenSigns.bits[load_u16(codes + 2 * l) >> 9]) << (8 * l);
      const __m128i indices = _mm_and_si128(
          _mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes))),
          _mm_set1_epi32(511));
      const uint32_t s = w[66 + ib];
      dot = _mm256_add_epi32(
          dot, scaled_dot(rows_of_8(grid, indices), sign_bytes(signs), x[i].qs + 32 * ib,
                          scales_16(2 * (s & 15) + 1, 2 * (s >> 4) + 1)));
    }
    sum += load_fp16(w) * x[i].d * static_cast<float>(hsum_epi32(dot));
  }
  return 0.125f * sum;
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
