// portable Q5_K (5.5 bits/weight): Q4_K's scales, mins and 4-bit codes,
// with a fifth bit per code from qh. w = (d * scale) * q - dmin * min.
#pragma once

#include "q4_k.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A block's 256 codes (0..31) in element order: Q4_K's nibbles plus 16
// where bit k of qh[l] is set, for element 32k + l.
inline void unpack_q5_k(const kquant::Q5K& b, int8_t codes[kquant::kBlock]) {
  unpack_q4_k(b.qs, codes);
  for (int k = 0; k < 8; ++k)
    for (int l = 0; l < 32; ++l) codes[32 * k + l] |= ((b.qh[l] >> k) & 1) << 4;
}

// A row of Q5_K blocks to float32, as gguf computes it.
void dequantize_row_q5_k(const uint8_t* src, float* y, int64_t n) {
  const kquant::Q5K* blocks = reinterpret_cast<const kquant::Q5K*>(src);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    uint8_t scales_mins[16];
    int8_t codes[kquant::kBlock];
    kquant::q4_k_scales_mins(blocks[i].scales, scales_mins);
    unpack_q5_k(blocks[i], codes);
    write_q4_k_values(load_fp16(blocks[i].d), load_fp16(blocks[i].dmin), scales_mins, codes, y);
  }
}

// Q5_K row . q8_K row: as Q4_K's.
float vec_dot_q5_k(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::Q5K* blocks = reinterpret_cast<const kquant::Q5K*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    uint8_t scales_mins[16];
    int8_t codes[kquant::kBlock];
    kquant::q4_k_scales_mins(blocks[i].scales, scales_mins);
    unpack_q5_k(blocks[i], codes);
    int32_t min_dot;
    const int32_t dot = q4_k_scaled_dot(scales_mins, codes, x[i], min_dot);
    sum += x[i].d * load_fp16(blocks[i].d) * static_cast<float>(dot) -
           x[i].d * load_fp16(blocks[i].dmin) * static_cast<float>(min_dot);
  }
  return sum;
}

// A row of Q5_K blocks in the int8 GEMM's form: codes 0..31, scales and
// mins as Q4_K's.
void int8_unpack_row_q5_k(const uint8_t* src, void* dst, int64_t n) {
  const kquant::Q5K* blocks = reinterpret_cast<const kquant::Q5K*>(src);
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    unpack_q5_k(blocks[i], out[i].codes);
    kquant::set_q4_k_int8_groups(blocks[i].scales, load_fp16(blocks[i].d),
                                  load_fp16(blocks[i].dmin), out[i]);
  }
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
