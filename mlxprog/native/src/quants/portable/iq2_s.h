// portable IQ2_S (2.56 bits/weight): per 256 an fp16 d, 32 low index bytes,
// 32 sign bytes (one bit per weight), 8 bytes of 2-bit index highs (10-bit
// indices into the 1024 x 8 iq2s_grid) and 8 bytes of 4-bit scales s, one
// per 16; w = d * (0.5 + s) / 4 * grid * sign.
#pragma once

#include "iq_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A row of IQ2_S blocks to float32, as gguf computes it.
void dequantize_row_iq2_s(const uint8_t* src, float* y, int64_t n) {
  const uint8_t* grid = grid_bytes(Codebook::iq2s);
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kIq2sBytes) {
    const float d = load_fp16(src);
    for (int half = 0; half < 16; ++half) {  // 16 weights per scale
      const uint32_t s = (src[74 + half / 2] >> (4 * (half % 2))) & 15;
      const float db = d * (0.5f + static_cast<float>(s)) * 0.25f;
      for (int k = 2 * half; k < 2 * half + 2; ++k, y += 8)
        write_signed_grid(db, grid + 8 * iq2_s_index(src, k), src[34 + k], y, 8);
    }
  }
}

// IQ2_S row . q8_K row: exact integer sums per 16 weighted by 2s + 1 (the
// scale times 8), one float product per block.
float vec_dot_iq2_s(int64_t n, const uint8_t* w, const void* xv) {
  const uint8_t* grid = grid_bytes(Codebook::iq2s);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, w += kIq2sBytes) {
    const int8_t* q = x[i].qs;
    int32_t block_sum = 0;
    for (int half = 0; half < 16; ++half) {
      int32_t sub_sum = 0;
      for (int k = 2 * half; k < 2 * half + 2; ++k, q += 8)
        sub_sum += signed_grid_dot(grid + 8 * iq2_s_index(w, k), w[34 + k], q, 8);
      const int32_t s = (w[74 + half / 2] >> (4 * (half % 2))) & 15;
      block_sum += sub_sum * (2 * s + 1);
    }
    sum += load_fp16(w) * x[i].d * static_cast<float>(block_sum);
  }
  return 0.125f * sum;
}

// A row of IQ2_S blocks in the int8 GEMM's form: codes +-grid, each 16's
// 2s + 1 its group's scale, d / 8 (vec_dot's sums regrouped).
void int8_unpack_row_iq2_s(const uint8_t* src, void* dst, int64_t n) {
  const uint8_t* grid = grid_bytes(Codebook::iq2s);
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kIq2sBytes) {
    int8_t* codes = out[i].codes;
    int scales[16];
    for (int half = 0; half < 16; ++half) {
      scales[half] = nibble_scale(src + 74, half);
      for (int k = 2 * half; k < 2 * half + 2; ++k, codes += 8)
        write_signed_codes(grid + 8 * iq2_s_index(src, k), src[34 + k], codes, 8);
    }
    set_iq_int8_groups(scales, 16, 0.125f * load_fp16(src), out[i]);
  }
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
