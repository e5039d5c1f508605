// x86 IQ1_M (AVX2): the dot product with q8_K activations (the portable
// kernels dequantize and unpack; portable/iq1_m.h has the layout).
#pragma once

#include "iq_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// IQ1_M row . q8_K row: per 32, four ternary grid rows as codes 8 * grid
// +- 1 (each 8's shift folded in, as the int8 unpacker does), each 16
// weighted by its 2s + 1: 8 times the portable kernel's grid sum plus its
// shift sum, exactly, so one float product per block gives its result.
float vec_dot_iq1_m(int64_t n, const uint8_t* w, const void* xv) {
  using namespace iq_x86;
  const uint8_t* grid = grid_bytes("iq1s_grid");
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  const __m256i eight = _mm256_set1_epi8(8);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, w += kIq1mBytes) {
    __m256i dot = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      // The four groups' 4-bit fields: iq1_m_index in lanes (low bytes,
      // the fields' 3-bit highs) and each 8's shift, -1 where bit 3 is set.
      const uint32_t fields = load_u16(w + 32 + 2 * ib);
      const __m128i indices = _mm_or_si128(bytes_4(w + 4 * ib), high_bits_4(fields, 4, 7));
      int64_t shifts[4];
      for (int l = 0; l < 4; ++l) shifts[l] = (fields >> (4 * l)) & 8 ? -1 : 0x0101010101010101;
      const __m256i codes =
          _mm256_add_epi8(_mm256_sign_epi8(eight, rows_of_8(grid, indices)),
                          _mm256_set_epi64x(shifts[3], shifts[2], shifts[1], shifts[0]));
      dot = _mm256_add_epi32(
          dot, scaled_dot_signed(codes, x[i].qs + 32 * ib,
                                 scales_16(iq1_m_scale(w, 2 * ib), iq1_m_scale(w, 2 * ib + 1))));
    }
    sum += iq1_m_d(w) * x[i].d * (0.125f * static_cast<float>(hsum_epi32(dot)));
  }
  return sum;
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
