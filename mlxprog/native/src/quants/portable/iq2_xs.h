// portable IQ2_XS (2.31 bits/weight): per 256 an fp16 d, 32 uint16 (per 8
// weights a 9-bit index into the 512 x 8 iq2xs_grid and a 7-bit sign index)
// and 8 bytes of 4-bit scales s, one per 16; w = d * (0.5 + s) / 4 * grid * sign.
#pragma once

#include "iq_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A row of IQ2_XS blocks to float32, as gguf computes it.
void dequantize_row_iq2_xs(const uint8_t* src, float* y, int64_t n) {
  const uint8_t* grid = grid_bytes(Codebook::iq2xs);
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kIq2xsBytes) {
    const float d = load_fp16(src);
    const uint8_t* scales = src + 66;
    for (int half = 0; half < 16; ++half) {  // 16 weights per scale
      const uint32_t s = (scales[half / 2] >> (4 * (half % 2))) & 15;
      const float db = d * (0.5f + static_cast<float>(s)) * 0.25f;
      for (int k = 2 * half; k < 2 * half + 2; ++k, y += 8) {
        const uint32_t code = load_u16(src + 2 + 2 * k);
        write_signed_grid(db, grid + 8 * (code & 511), even_signs(code >> 9), y, 8);
      }
    }
  }
}

// IQ2_XS row . q8_K row: exact integer sums per 16 weighted by 2s + 1 (the
// scale times 8), one float product per block.
float vec_dot_iq2_xs(int64_t n, const uint8_t* w, const void* xv) {
  const uint8_t* grid = grid_bytes(Codebook::iq2xs);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, w += kIq2xsBytes) {
    const int8_t* q = x[i].qs;
    const uint8_t* scales = w + 66;
    int32_t block_sum = 0;
    for (int half = 0; half < 16; ++half) {
      int32_t sub_sum = 0;
      for (int k = 2 * half; k < 2 * half + 2; ++k, q += 8) {
        const uint32_t code = load_u16(w + 2 + 2 * k);
        sub_sum += signed_grid_dot(grid + 8 * (code & 511), even_signs(code >> 9), q, 8);
      }
      const int32_t s = (scales[half / 2] >> (4 * (half % 2))) & 15;
      block_sum += sub_sum * (2 * s + 1);
    }
    sum += load_fp16(w) * x[i].d * static_cast<float>(block_sum);
  }
  return 0.125f * sum;
}

// A row of IQ2_XS blocks in the int8 GEMM's form: codes +-grid, each 16's
// 2s + 1 its group's scale, d / 8 (vec_dot's sums regrouped).
void int8_unpack_row_iq2_xs(const uint8_t* src, void* dst, int64_t n) {
  const uint8_t* grid = grid_bytes(Codebook::iq2xs);
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kIq2xsBytes) {
    int8_t* codes = out[i].codes;
    int scales[16];
    for (int half = 0; half < 16; ++half) {
      scales[half] = nibble_scale(src + 66, half);
      for (int k = 2 * half; k < 2 * half + 2; ++k, codes += 8) {
        const uint32_t code = load_u16(src + 2 + 2 * k);
        write_signed_codes(grid + 8 * (code & 511), even_signs(code >> 9), codes, 8);
      }
    }
    set_iq_int8_groups(scales, 16, 0.125f * load_fp16(src), out[i]);
  }
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
