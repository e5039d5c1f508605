// portable IQ1_M (1.75 bits/weight): per 256, 32 low index bytes, 16 bytes
// of 4-bit fields (per 8 weights a 3-bit index high, making 11-bit indices
// into the 2048 x 8 ternary iq1s_grid, and the sign of a shift delta =
// +-1/8), and four uint16 holding 3-bit scales s (one per 16) in their low
// 12 bits and the fp16 d in their top nibbles; w = d * (2s + 1) * (grid + delta).
#pragma once

#include "iq_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A row of IQ1_M blocks to float32, as gguf computes it.
void dequantize_row_iq1_m(const uint8_t* src, float* y, int64_t n) {
  const int8_t* grid = reinterpret_cast<const int8_t*>(grid_bytes(Codebook::iq1s));
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kIq1mBytes) {
    const float d = iq1_m_d(src);
    for (int h = 0; h < 16; ++h) {
      const float dl = d * static_cast<float>(iq1_m_scale(src, h));
      for (int k = 2 * h; k < 2 * h + 2; ++k, y += 8) {
        const float delta = iq1_m_field(src, k) & 8 ? -0.125f : 0.125f;
        write_shifted_grid(dl, grid + 8 * iq1_m_index(src, k), delta, y);
      }
    }
  }
}

// IQ1_M row . q8_K row: per block, the integer sums of grid . q and of the
// signed shifts (+-1 times each 8 codes' sum), each weighted by 2s + 1, meet
// in one float: d * (grid part + shift part / 8).
float vec_dot_iq1_m(int64_t n, const uint8_t* w, const void* xv) {
  const int8_t* grid = reinterpret_cast<const int8_t*>(grid_bytes(Codebook::iq1s));
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, w += kIq1mBytes) {
    const int8_t* q = x[i].qs;
    int32_t grid_sum = 0, shift_sum = 0;
    for (int h = 0; h < 16; ++h) {
      int32_t sub_grid = 0, sub_shift = 0;
      for (int k = 2 * h; k < 2 * h + 2; ++k, q += 8) {
        sub_grid += ternary_grid_dot(grid + 8 * iq1_m_index(w, k), q);
        const int32_t codes = code_sum8(q);
        sub_shift += iq1_m_field(w, k) & 8 ? -codes : codes;
      }
      const int32_t scale = iq1_m_scale(w, h);
      grid_sum += scale * sub_grid;
      shift_sum += scale * sub_shift;
    }
    sum += iq1_m_d(w) * x[i].d *
           (static_cast<float>(grid_sum) + 0.125f * static_cast<float>(shift_sum));
  }
  return sum;
}

// A row of IQ1_M blocks in the int8 GEMM's form: codes 8 * grid +- 1 (each
// 8's shift folded in), each 16's 2s + 1 its group's scale, d / 8
// (vec_dot's grid and shift sums as one integer sum).
void int8_unpack_row_iq1_m(const uint8_t* src, void* dst, int64_t n) {
  const int8_t* grid = reinterpret_cast<const int8_t*>(grid_bytes(Codebook::iq1s));
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kIq1mBytes) {
    int8_t* codes = out[i].codes;
    int scales[16];
    for (int h = 0; h < 16; ++h) {
      scales[h] = iq1_m_scale(src, h);
      for (int k = 2 * h; k < 2 * h + 2; ++k, codes += 8)
        write_shifted_codes(grid + 8 * iq1_m_index(src, k), iq1_m_field(src, k) & 8, codes);
    }
    set_iq_int8_groups(scales, 16, 0.125f * iq1_m_d(src), out[i]);
  }
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
