// portable IQ1_S (1.56 bits/weight): per 256 an fp16 d, 32 low index bytes,
// then per 32 a uint16: four 3-bit index highs (11-bit indices, per 8 weights
// a row of the 2048 x 8 ternary iq1s_grid), a 3-bit scale s and the sign of
// a shift delta = +-1/8; w = d * (2s + 1) * (grid + delta).
#pragma once

#include "iq_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A row of IQ1_S blocks to float32, as gguf computes it.
void dequantize_row_iq1_s(const uint8_t* src, float* y, int64_t n) {
  const int8_t* grid = reinterpret_cast<const int8_t*>(grid_bytes(Codebook::iq1s));
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kIq1sBytes) {
    const float d = load_fp16(src);
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t high = load_u16(src + 34 + 2 * ib);
      const float dl = d * static_cast<float>(2 * ((high >> 12) & 7) + 1);
      const float delta = high & 0x8000 ? -0.125f : 0.125f;
      for (int l = 0; l < 4; ++l, y += 8)
        write_shifted_grid(dl, grid + 8 * iq1_s_index(src + 2 + 4 * ib, high, l), delta, y);
    }
  }
}

// IQ1_S row . q8_K row: per block, the integer sums of grid . q and of the
// signed shifts (+-1 times the q8 block's per-16 sums), each weighted by
// 2s + 1, meet in one float: d * (grid part + shift part / 8).
float vec_dot_iq1_s(int64_t n, const uint8_t* w, const void* xv) {
  const int8_t* grid = reinterpret_cast<const int8_t*>(grid_bytes(Codebook::iq1s));
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, w += kIq1sBytes) {
    const int8_t* q = x[i].qs;
    int32_t grid_sum = 0, shift_sum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t high = load_u16(w + 34 + 2 * ib);
      int32_t sub_sum = 0;
      for (int l = 0; l < 4; ++l, q += 8)
        sub_sum += ternary_grid_dot(grid + 8 * iq1_s_index(w + 2 + 4 * ib, high, l), q);
      const int32_t scale = static_cast<int32_t>(2 * ((high >> 12) & 7) + 1);
      const int32_t codes = x[i].bsums[2 * ib] + x[i].bsums[2 * ib + 1];
      grid_sum += scale * sub_sum;
      shift_sum += scale * (high & 0x8000 ? -codes : codes);
    }
    sum += load_fp16(w) * x[i].d *
           (static_cast<float>(grid_sum) + 0.125f * static_cast<float>(shift_sum));
  }
  return sum;
}

// A row of IQ1_S blocks in the int8 GEMM's form: codes 8 * grid +- 1 (the
// shift folded in), each 32's 2s + 1 its two groups' scale, d / 8
// (vec_dot's grid and shift sums as one integer sum).
void int8_unpack_row_iq1_s(const uint8_t* src, void* dst, int64_t n) {
  const int8_t* grid = reinterpret_cast<const int8_t*>(grid_bytes(Codebook::iq1s));
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kIq1sBytes) {
    int8_t* codes = out[i].codes;
    int scales[8];
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t high = load_u16(src + 34 + 2 * ib);
      scales[ib] = static_cast<int>(2 * ((high >> 12) & 7) + 1);
      for (int l = 0; l < 4; ++l, codes += 8)
        write_shifted_codes(grid + 8 * iq1_s_index(src + 2 + 4 * ib, high, l), high & 0x8000,
                            codes);
    }
    set_iq_int8_groups(scales, 8, 0.125f * load_fp16(src), out[i]);
  }
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
