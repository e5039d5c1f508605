// portable IQ4_NL (4.5 bits/weight): per 32, an fp16 d and 16 bytes of
// 4-bit indices q into a fixed non-linear table of int8 values (common.h);
// w = d * kIq4Levels[q].
#pragma once

#include "block32.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace block32 {

// A row of IQ4_NL blocks to float32, as gguf computes it.
void dequantize_row_iq4_nl(const uint8_t* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kBlock32; ++i, src += kIq4nlBytes, y += kBlock32) {
    const float d = load_fp16(src);
    int32_t codes[kBlock32];
    table_codes(src + 2, kIq4Levels, codes);
    for (int j = 0; j < kBlock32; ++j) y[j] = d * static_cast<float>(codes[j]);
  }
}

// IQ4_NL row . q8_0 row: per block an integer dot of the table values with
// the q8 codes, scaled by d_w * d_x.
float vec_dot_iq4_nl(int64_t n, const uint8_t* w, const void* xv) {
  const BlockQ8_0* x = static_cast<const BlockQ8_0*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kBlock32; ++i, w += kIq4nlBytes) {
    int32_t codes[kBlock32];
    table_codes(w + 2, kIq4Levels, codes);
    sum += static_cast<float>(dot_codes(codes, x[i].qs)) * (load_fp16(w) * x[i].d);
  }
  return sum;
}

// A row of IQ4_NL blocks in the int8 GEMM's form: the table values (signed).
void int8_unpack_row_iq4_nl(const uint8_t* src, void* dst, int64_t n) {
  Int8Block32* out = static_cast<Int8Block32*>(dst);
  for (int64_t i = 0; i < n / kBlock32; ++i, src += kIq4nlBytes) {
    int32_t codes[kBlock32];
    table_codes(src + 2, kIq4Levels, codes);
    write_int8_block(codes, load_fp16(src), 0.0f, out[i]);
  }
}

}  // namespace block32
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
