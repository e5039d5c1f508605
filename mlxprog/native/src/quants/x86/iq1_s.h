// x86 IQ1_S (AVX2): the dot product with q8_K activations (the portable
// kernels dequantize and unpack; portable/iq1_s.h has the layout).
#pragma once

#include "iq_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// IQ1_S row . q8_K row: per 32, four ternary grid rows as codes 8 * grid
// +- 1 (the shift folded in, as the int8 unpacker does), weighted by 2s +
// 1: 8 times the portable kernel's grid sum plus its shift sum, exactly, so
// one float product per block gives its result.
float vec_dot_iq1_s(int64_t n, const uint8_t* w, const void* xv) {
  using namespace iq_x86;
  const uint8_t* grid = grid_bytes("iq1s_grid");
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  const __m256i eight = _mm256_set1_epi8(8);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, w += kIq1sBytes) {
    __m256i dot = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t high = load_u16(w + 34 + 2 * ib);
      // iq1_s_index of the four groups in lanes: low bytes, 3-bit highs.
      const __m128i indices = _mm_or_si128(bytes_4(w + 2 + 4 * ib), high_bits_4(high, 3, 7));
      const __m256i codes = _mm256_add_epi8(_mm256_sign_epi8(eight, rows_of_8(grid, indices)),
          _mm256_set1_epi8(high & 0x8000 ? -1 : 1));
      const int scale = static_cast<int>(2 * ((high >> 12) & 7) + 1);
      dot = _mm256_add_epi32(dot,
                             scaled_dot_signed(codes, x[i].qs + 32 * ib, scales_16(scale, scale)));
    }
    sum += load_fp16(w) * x[i].d * (0.125f * static_cast<float>(hsum_epi32(dot)));
  }
  return sum;
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
