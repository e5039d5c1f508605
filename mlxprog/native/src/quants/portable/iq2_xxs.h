// portable IQ2_XXS (2.06 bits/weight): per 256 an fp16 d, then per 32 two
// uint32: four grid indices (bytes into the 256 x 8 iq2xxs_grid), and four
// 7-bit sign indices plus a 4-bit scale s; w = d * (0.5 + s) / 4 * grid * sign.
#pragma once

#include "iq_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A row of IQ2_XXS blocks to float32, as gguf computes it.
void dequantize_row_iq2_xxs(const uint8_t* src, float* y, int64_t n) {
  const uint8_t* grid = grid_bytes(Codebook::iq2xxs);
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kIq2xxsBytes) {
    const float d = load_fp16(src);
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* indices = src + 2 + 8 * ib;
      const uint32_t meta = load_u32(indices + 4);
      const float db = d * (0.5f + static_cast<float>(meta >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l, y += 8)
        write_signed_grid(db, grid + 8 * indices[l], even_signs((meta >> (7 * l)) & 127), y, 8);
    }
  }
}

// IQ2_XXS row . q8_K row: exact integer sums per 32 weighted by 2s + 1 (the
// scale times 8), one float product per block.
float vec_dot_iq2_xxs(int64_t n, const uint8_t* w, const void* xv) {
  const uint8_t* grid = grid_bytes(Codebook::iq2xxs);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, w += kIq2xxsBytes) {
    const int8_t* q = x[i].qs;
    int32_t block_sum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* indices = w + 2 + 8 * ib;
      const uint32_t meta = load_u32(indices + 4);
      int32_t sub_sum = 0;
      for (int l = 0; l < 4; ++l, q += 8)
        sub_sum += signed_grid_dot(grid + 8 * indices[l], even_signs((meta >> (7 * l)) & 127), q, 8);
      block_sum += sub_sum * xxs_scale(meta);
    }
    sum += load_fp16(w) * x[i].d * static_cast<float>(block_sum);
  }
  return 0.125f * sum;
}

// A row of IQ2_XXS blocks in the int8 GEMM's form: codes +-grid, each
// 32's 2s + 1 its two groups' scale, d / 8 (vec_dot's sums regrouped).
void int8_unpack_row_iq2_xxs(const uint8_t* src, void* dst, int64_t n) {
  const uint8_t* grid = grid_bytes(Codebook::iq2xxs);
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kIq2xxsBytes) {
    int8_t* codes = out[i].codes;
    int scales[8];
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* indices = src + 2 + 8 * ib;
      const uint32_t meta = load_u32(indices + 4);
      scales[ib] = xxs_scale(meta);
      for (int l = 0; l < 4; ++l, codes += 8)
        write_signed_codes(grid + 8 * indices[l], even_signs((meta >> (7 * l)) & 127), codes, 8);
    }
    set_iq_int8_groups(scales, 8, 0.125f * load_fp16(src), out[i]);
  }
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
