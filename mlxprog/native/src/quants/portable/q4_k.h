// portable Q4_K (4.5 bits/weight): per 256, fp16 d and dmin; per 32, a
// 6-bit scale and a 6-bit min; 4-bit codes q.
// w = (d * scale) * q - dmin * min.
#pragma once

#include "kquant_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A block's 256 codes (0..15) in element order: each 64 elements are 32
// bytes, the low nibbles the first 32, the high nibbles the next 32.
inline void unpack_q4_k(const uint8_t* qs, int8_t codes[kquant::kBlock]) {
  for (int chunk = 0; chunk < 4; ++chunk)
    for (int l = 0; l < 32; ++l) {
      codes[64 * chunk + l] = qs[32 * chunk + l] & 0x0F;
      codes[64 * chunk + 32 + l] = qs[32 * chunk + l] >> 4;
    }
}

// Writes a block of 32-element sub-blocks (d * scale) * q - dmin * min, as
// gguf rounds it; Q5_K shares it.
inline void write_q4_k_values(float d, float dmin, const uint8_t scales_mins[16],
                              const int8_t codes[kquant::kBlock], float* y) {
  for (int sub = 0; sub < 8; ++sub) {
    const float scale = d * static_cast<float>(scales_mins[sub]);
    const float offset = dmin * static_cast<float>(scales_mins[8 + sub]);
    for (int j = 32 * sub; j < 32 * sub + 32; ++j)
      y[j] = kquant::rounded_product(scale * static_cast<float>(codes[j])) - offset;
  }
}

// A block's sum scale * (q . q8) minus, in `min_dot`, sum min * (the q8
// sums of its 32); Q5_K shares it.
inline int32_t q4_k_scaled_dot(const uint8_t scales_mins[16], const int8_t codes[kquant::kBlock],
                               const BlockQ8_K& x, int32_t& min_dot) {
  int32_t dot = 0;
  min_dot = 0;
  for (int sub = 0; sub < 8; ++sub) {
    dot += scales_mins[sub] * kquant::code_dot(codes + 32 * sub, x.qs + 32 * sub, 32);
    min_dot += scales_mins[8 + sub] * (x.bsums[2 * sub] + x.bsums[2 * sub + 1]);
  }
  return dot;
}

// A row of Q4_K blocks to float32, as gguf computes it.
void dequantize_row_q4_k(const uint8_t* src, float* y, int64_t n) {
  const kquant::Q4K* blocks = reinterpret_cast<const kquant::Q4K*>(src);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    uint8_t scales_mins[16];
    int8_t codes[kquant::kBlock];
    kquant::q4_k_scales_mins(blocks[i].scales, scales_mins);
    unpack_q4_k(blocks[i].qs, codes);
    write_q4_k_values(load_fp16(blocks[i].d), load_fp16(blocks[i].dmin), scales_mins, codes, y);
  }
}

// Q4_K row . q8_K row: per block d_w * d_x * sum scale * (q . q8) minus
// dmin_w * d_x * sum min * (the q8 sums of its 32).
float vec_dot_q4_k(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::Q4K* blocks = reinterpret_cast<const kquant::Q4K*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    uint8_t scales_mins[16];
    int8_t codes[kquant::kBlock];
    kquant::q4_k_scales_mins(blocks[i].scales, scales_mins);
    unpack_q4_k(blocks[i].qs, codes);
    int32_t min_dot;
    const int32_t dot = q4_k_scaled_dot(scales_mins, codes, x[i], min_dot);
    sum += x[i].d * load_fp16(blocks[i].d) * static_cast<float>(dot) -
           x[i].d * load_fp16(blocks[i].dmin) * static_cast<float>(min_dot);
  }
  return sum;
}

// A row of Q4_K blocks in the int8 GEMM's form: codes 0..15.
void int8_unpack_row_q4_k(const uint8_t* src, void* dst, int64_t n) {
  const kquant::Q4K* blocks = reinterpret_cast<const kquant::Q4K*>(src);
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    unpack_q4_k(blocks[i].qs, out[i].codes);
    kquant::set_q4_k_int8_groups(blocks[i].scales, load_fp16(blocks[i].d),
                                  load_fp16(blocks[i].dmin), out[i]);
  }
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
