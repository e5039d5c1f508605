// x86 IQ2_S (AVX2): the dot product with q8_K activations (the portable
// kernels dequantize and unpack; portable/iq2_s.h has the layout).
#pragma once

#include "iq_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// IQ2_S row . q8_K row: per 32, four 10-bit grid rows and a sign byte for
// each, each 16 weighted by its 2s + 1; the portable kernel's integer sums,
// one float product per block.
float vec_dot_iq2_s(int64_t n, const uint8_t* w, const void* xv) {
  using namespace iq_x86;
  const uint8_t* grid = grid_bytes("iq2s_grid");
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, w += kIq2sBytes) {
    __m256i dot = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      // iq2_s_index of the four groups in lanes: low bytes, 2-bit highs.
      const __m128i indices =
          _mm_or_si128(bytes_4(w + 2 + 4 * ib), high_bits_4(w[66 + ib], 2, 3));
      const uint32_t s = w[74 + ib];
      dot = _mm256_add_epi32(
          dot, scaled_dot(rows_of_8(grid, indices),
                          sign_bytes(load_u32(w + 34 + 4 * ib)), x[i].qs + 32 * ib,
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
