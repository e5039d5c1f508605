// x86 IQ2_XXS (AVX2): the dot product with q8_K activations (the portable
// kernels dequantize and unpack; portable/iq2_xxs.h has the layout).
#pragma once

#include "iq_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// IQ2_XXS row . q8_K row: per 32, four 8-byte grid rows and their 32 sign
// bits against the q8 codes, weighted by 2s + 1; the portable kernel's
// integer sums, one float product per block.
float vec_dot_iq2_xxs(int64_t n, const uint8_t* w, const void* xv) {
  using namespace iq_x86;
  const uint8_t* grid = grid_bytes("iq2xxs_grid");
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, w += kIq2xxsBytes) {
    __m256i dot = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* indices = w + 2 + 8 * ib;
      const uint32_t meta = load_u32(indices + 4);
      const int scale = static_cast<int>(2 * (meta >> 28) + 1);
      dot = _mm256_add_epi32(
          dot, scaled_dot(rows_of_8(grid, bytes_4(indices)),
                          sign_bytes(even_signs_32(meta)), x[i].qs + 32 * ib,
                          scales_16(scale, scale)));
    }
    sum += load_fp16(w) * x[i].d * static_cast<float>(hsum_epi32(dot));
  }
  return 0.125f * sum;
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
