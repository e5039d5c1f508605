// portable Q5_1 (6 bits/weight): per 32, an fp16 scale d, an fp16 minimum
// m, a uint32 of fifth bits (bit j for element j) and 16 bytes of low
// nibbles; q the 5-bit code, w = d * q + m.
#pragma once

#include "block32.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace block32 {

// A row of Q5_1 blocks to float32, as gguf computes it (d * q rounded, then
// + m).
void dequantize_row_q5_1(const uint8_t* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kBlock32; ++i, src += kQ5_1Bytes, y += kBlock32) {
    const float d = load_fp16(src), m = load_fp16(src + 2);
    int32_t codes[kBlock32];
    unpack_5bit_codes(src + 4, src + 8, codes);
    for (int j = 0; j < kBlock32; ++j) y[j] = rounded_product(d * static_cast<float>(codes[j])) + m;
  }
}

// Q5_1 row . q8_1 row: per block d_w * d_x * sum q * q8 + m * s, s being the
// q8_1 block's d_x * sum q8 (llama.cpp's use of the block sums).
float vec_dot_q5_1(int64_t n, const uint8_t* w, const void* xv) {
  const BlockQ8_1* x = static_cast<const BlockQ8_1*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kBlock32; ++i, w += kQ5_1Bytes) {
    int32_t codes[kBlock32];
    unpack_5bit_codes(w + 4, w + 8, codes);
    sum += static_cast<float>(dot_codes(codes, x[i].qs)) * (load_fp16(w) * x[i].d) +
           load_fp16(w + 2) * x[i].s;
  }
  return sum;
}

// A row of Q5_1 blocks in the int8 GEMM's form: codes q (0..31), d and m.
void int8_unpack_row_q5_1(const uint8_t* src, void* dst, int64_t n) {
  Int8Block32* out = static_cast<Int8Block32*>(dst);
  for (int64_t i = 0; i < n / kBlock32; ++i, src += kQ5_1Bytes) {
    int32_t codes[kBlock32];
    unpack_5bit_codes(src + 4, src + 8, codes);
    write_int8_block(codes, load_fp16(src), load_fp16(src + 2), out[i]);
  }
}

}  // namespace block32
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
