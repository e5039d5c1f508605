// portable Q2_K (2.625 bits/weight): per 256, fp16 d and dmin; per 16, a
// 4-bit scale and a 4-bit min; 2-bit codes q.
// w = (d * scale) * q - dmin * min.
#pragma once

#include "kquant_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A block's 256 codes (0..3) in element order: each 128 elements are 32
// bytes, bits 2s..2s+1 of byte l holding element 32s + l.
inline void unpack_q2_k(const kquant::Q2K& b, int8_t codes[kquant::kBlock]) {
  for (int half = 0; half < 2; ++half)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l)
        codes[128 * half + 32 * s + l] = (b.qs[32 * half + l] >> (2 * s)) & 3;
}

// A row of Q2_K blocks to float32, as gguf computes it.
void dequantize_row_q2_k(const uint8_t* src, float* y, int64_t n) {
  const kquant::Q2K* blocks = reinterpret_cast<const kquant::Q2K*>(src);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    const float d = load_fp16(blocks[i].d), dmin = load_fp16(blocks[i].dmin);
    int8_t codes[kquant::kBlock];
    unpack_q2_k(blocks[i], codes);
    for (int sub = 0; sub < 16; ++sub) {
      const float scale = d * static_cast<float>(blocks[i].scales[sub] & 0x0F);
      const float offset = dmin * static_cast<float>(blocks[i].scales[sub] >> 4);
      for (int j = 16 * sub; j < 16 * sub + 16; ++j)
        y[j] = kquant::rounded_product(scale * static_cast<float>(codes[j])) - offset;
    }
  }
}

// Q2_K row . q8_K row: per block d_w * d_x * sum scale * (q . q8) minus
// dmin_w * d_x * sum min * (the q8 sums of its 16).
float vec_dot_q2_k(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::Q2K* blocks = reinterpret_cast<const kquant::Q2K*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    int8_t codes[kquant::kBlock];
    unpack_q2_k(blocks[i], codes);
    int32_t dot = 0, min_dot = 0;
    for (int sub = 0; sub < 16; ++sub) {
      dot += (blocks[i].scales[sub] & 0x0F) *
             kquant::code_dot(codes + 16 * sub, x[i].qs + 16 * sub, 16);
      min_dot += (blocks[i].scales[sub] >> 4) * x[i].bsums[sub];
    }
    sum += x[i].d * load_fp16(blocks[i].d) * static_cast<float>(dot) -
           x[i].d * load_fp16(blocks[i].dmin) * static_cast<float>(min_dot);
  }
  return sum;
}

// A row of Q2_K blocks in the int8 GEMM's form: codes 0..3, each 16's
// scale and min, dm = -dmin.
void int8_unpack_row_q2_k(const uint8_t* src, void* dst, int64_t n) {
  const kquant::Q2K* blocks = reinterpret_cast<const kquant::Q2K*>(src);
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    unpack_q2_k(blocks[i], out[i].codes);
    int scales[16], mins[16];
    for (int g = 0; g < 16; ++g)
      scales[g] = blocks[i].scales[g] & 0x0F, mins[g] = blocks[i].scales[g] >> 4;
    kquant::set_int8_groups(scales, mins, 16, load_fp16(blocks[i].d), -load_fp16(blocks[i].dmin),
                            out[i]);
  }
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
