// x86 IQ3_S (AVX2): the dot product with q8_K activations (the portable
// kernels dequantize and unpack; portable/iq3_s.h has the layout).
#pragma once

#include "iq_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// IQ3_S row . q8_K row: per 32, eight 9-bit grid rows of 4 and four sign
// bytes, weighted by 1 + 2s; the portable kernel's integer sums, one float
// product per block.
float vec_dot_iq3_s(int64_t n, const uint8_t* w, const void* xv) {
  using namespace iq_x86;
  const uint8_t* grid = grid_bytes("iq3s_grid");
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, w += kIq3sBytes) {
    __m256i dot = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      // iq3_s_index of the eight groups in lanes: bit k of the high byte
      // moved to bit 8 of index k.
      const __m256i high = _mm256_and_si256(
          _mm256_sllv_epi32(_mm256_set1_epi32(w[66 + ib]), _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1)),
          _mm256_set1_epi32(0x100));
      const __m256i indices = _mm256_or_si256(bytes_8(w + 2 + 8 * ib), high);
      const int scale = iq3_s_scale(w, ib);
      dot = _mm256_add_epi32(dot, scaled_dot(rows_of_4(grid, indices),
                                             sign_bytes(load_u32(w + 74 + 4 * ib)),
                                             x[i].qs + 32 * ib, scales_16(scale, scale)));
    }
    sum += load_fp16(w) * x[i].d * static_cast<float>(hsum_epi32(dot));
  }
  return sum;
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
