// portable Q4_0 (4.5 bits/weight): per 32, an fp16 d and 16 bytes of 4-bit
// codes q; w = d * (q - 8).
#pragma once

#include "block32.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace block32 {

// A row of Q4_0 blocks to float32, as gguf computes it.
void dequantize_row_q4_0(const uint8_t* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kBlock32; ++i, src += kQ4_0Bytes, y += kBlock32) {
    const float d = load_fp16(src);
    int32_t codes[kBlock32];
    unpack_4bit_codes(src + 2, codes);
    for (int j = 0; j < kBlock32; ++j) y[j] = d * static_cast<float>(codes[j] - 8);
  }
}

// Q4_0 row . q8_0 row: per block an integer dot of (q - 8) with the q8
// codes, scaled by d_w * d_x.
float vec_dot_q4_0(int64_t n, const uint8_t* w, const void* xv) {
  const BlockQ8_0* x = static_cast<const BlockQ8_0*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kBlock32; ++i, w += kQ4_0Bytes) {
    int32_t codes[kBlock32];
    unpack_4bit_codes(w + 2, codes);
    for (int32_t& c : codes) c -= 8;
    sum += static_cast<float>(dot_codes(codes, x[i].qs)) * (load_fp16(w) * x[i].d);
  }
  return sum;
}

// A row of Q4_0 blocks in the int8 GEMM's form: signed codes q - 8.
void int8_unpack_row_q4_0(const uint8_t* src, void* dst, int64_t n) {
  Int8Block32* out = static_cast<Int8Block32*>(dst);
  for (int64_t i = 0; i < n / kBlock32; ++i, src += kQ4_0Bytes) {
    int32_t codes[kBlock32];
    unpack_4bit_codes(src + 2, codes);
    for (int32_t& c : codes) c -= 8;
    write_int8_block(codes, load_fp16(src), 0.0f, out[i]);
  }
}

}  // namespace block32
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
