// portable IQ3_S (3.44 bits/weight): per 256 an fp16 d, 64 low index bytes,
// 8 bytes of index high bits (9-bit indices, per 4 weights a row of the
// 512 x 4 iq3s_grid), 32 sign bytes (one bit per weight) and 4 bytes of
// 4-bit scales s, one per 32; w = d * (1 + 2s) * grid * sign.
#pragma once

#include "iq_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A row of IQ3_S blocks to float32, as gguf computes it.
void dequantize_row_iq3_s(const uint8_t* src, float* y, int64_t n) {
  const uint8_t* grid = grid_bytes(Codebook::iq3s);
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kIq3sBytes) {
    const float d = load_fp16(src);
    for (int ib = 0; ib < 8; ++ib) {
      const float db = d * static_cast<float>(iq3_s_scale(src, ib));
      for (int l = 4 * ib; l < 4 * ib + 4; ++l, y += 8) {  // l: 8 weights, one sign byte
        const uint32_t signs = src[74 + l];
        write_signed_grid(db, grid + 4 * iq3_s_index(src, 2 * l), signs, y, 4);
        write_signed_grid(db, grid + 4 * iq3_s_index(src, 2 * l + 1), signs >> 4, y + 4, 4);
      }
    }
  }
}

// IQ3_S row . q8_K row: exact integer sums per 32 weighted by 1 + 2s, one
// float product per block.
float vec_dot_iq3_s(int64_t n, const uint8_t* w, const void* xv) {
  const uint8_t* grid = grid_bytes(Codebook::iq3s);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, w += kIq3sBytes) {
    const int8_t* q = x[i].qs;
    int32_t block_sum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      int32_t sub_sum = 0;
      for (int l = 4 * ib; l < 4 * ib + 4; ++l, q += 8) {
        const uint32_t signs = w[74 + l];
        sub_sum += signed_grid_dot(grid + 4 * iq3_s_index(w, 2 * l), signs, q, 4) +
                   signed_grid_dot(grid + 4 * iq3_s_index(w, 2 * l + 1), signs >> 4, q + 4, 4);
      }
      block_sum += sub_sum * iq3_s_scale(w, ib);
    }
    sum += load_fp16(w) * x[i].d * static_cast<float>(block_sum);
  }
  return sum;
}

// A row of IQ3_S blocks in the int8 GEMM's form: codes +-grid, each 32's
// 1 + 2s its two groups' scale, d (vec_dot's sums regrouped).
void int8_unpack_row_iq3_s(const uint8_t* src, void* dst, int64_t n) {
  const uint8_t* grid = grid_bytes(Codebook::iq3s);
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kIq3sBytes) {
    int8_t* codes = out[i].codes;
    int scales[8];
    for (int ib = 0; ib < 8; ++ib) {
      scales[ib] = iq3_s_scale(src, ib);
      for (int l = 4 * ib; l < 4 * ib + 4; ++l, codes += 8) {
        const uint32_t signs = src[74 + l];
        write_signed_codes(grid + 4 * iq3_s_index(src, 2 * l), signs, codes, 4);
        write_signed_codes(grid + 4 * iq3_s_index(src, 2 * l + 1), signs >> 4, codes + 4, 4);
      }
    }
    set_iq_int8_groups(scales, 8, load_fp16(src), out[i]);
  }
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
