// portable IQ3_XXS (3.06 bits/weight): per 256 an fp16 d, 64 index bytes
// (per 4 weights a row of the 256 x 4 iq3xxs_grid), then per 32 a uint32 of
// four 7-bit sign indices and a 4-bit scale s; w = d * (0.5 + s) / 2 * grid * sign.
#pragma once

#include "iq_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A row of IQ3_XXS blocks to float32, as gguf computes it.
void dequantize_row_iq3_xxs(const uint8_t* src, float* y, int64_t n) {
  const uint8_t* grid = grid_bytes(Codebook::iq3xxs);
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kIq3xxsBytes) {
    const float d = load_fp16(src);
    const uint8_t* indices = src + 2;
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t meta = load_u32(src + 66 + 4 * ib);
      const float db = d * (0.5f + static_cast<float>(meta >> 28)) * 0.5f;
      for (int l = 0; l < 4; ++l, y += 8, indices += 2) {
        const uint32_t signs = even_signs((meta >> (7 * l)) & 127);
        write_signed_grid(db, grid + 4 * indices[0], signs, y, 4);
        write_signed_grid(db, grid + 4 * indices[1], signs >> 4, y + 4, 4);
      }
    }
  }
}

// IQ3_XXS row . q8_K row: exact integer sums per 32 weighted by 2s + 1 (the
// scale times 4), one float product per block.
float vec_dot_iq3_xxs(int64_t n, const uint8_t* w, const void* xv) {
  const uint8_t* grid = grid_bytes(Codebook::iq3xxs);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, w += kIq3xxsBytes) {
    const int8_t* q = x[i].qs;
    const uint8_t* indices = w + 2;
    int32_t block_sum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t meta = load_u32(w + 66 + 4 * ib);
      int32_t sub_sum = 0;
      for (int l = 0; l < 4; ++l, q += 8, indices += 2) {
        const uint32_t signs = even_signs((meta >> (7 * l)) & 127);
        sub_sum += signed_grid_dot(grid + 4 * indices[0], signs, q, 4) +
                   signed_grid_dot(grid + 4 * indices[1], signs >> 4, q + 4, 4);
      }
      block_sum += sub_sum * xxs_scale(meta);
    }
    sum += load_fp16(w) * x[i].d * static_cast<float>(block_sum);
  }
  return 0.25f * sum;
}

// A row of IQ3_XXS blocks in the int8 GEMM's form: codes +-grid, each
// 32's 2s + 1 its two groups' scale, d / 4 (vec_dot's sums regrouped).
void int8_unpack_row_iq3_xxs(const uint8_t* src, void* dst, int64_t n) {
  const uint8_t* grid = grid_bytes(Codebook::iq3xxs);
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kIq3xxsBytes) {
    int8_t* codes = out[i].codes;
    const uint8_t* indices = src + 2;
    int scales[8];
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t meta = load_u32(src + 66 + 4 * ib);
      scales[ib] = xxs_scale(meta);
      for (int l = 0; l < 4; ++l, codes += 8, indices += 2) {
        const uint32_t signs = even_signs((meta >> (7 * l)) & 127);
        write_signed_codes(grid + 4 * indices[0], signs, codes, 4);
        write_signed_codes(grid + 4 * indices[1], signs >> 4, codes + 4, 4);
      }
    }
    set_iq_int8_groups(scales, 8, 0.25f * load_fp16(src), out[i]);
  }
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
