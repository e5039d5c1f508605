// portable MXFP4 (4.25 bits/weight, OCP microscaling): per 32, an E8M0
// exponent byte e and 16 bytes of 4-bit E2M1 codes q; w = 2^(e - 127) *
// e2m1(q), computed as gguf and llama.cpp do: the E2M1 values doubled (so
// they are integers) times half the scale, 2^(e - 128).
#pragma once

#include "block32.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace block32 {

// A row of MXFP4 blocks to float32, as gguf computes it.
void dequantize_row_mxfp4(const uint8_t* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kBlock32; ++i, src += kMxfp4Bytes, y += kBlock32) {
    const float d = e8m0_half_scale(src[0]);
    int32_t codes[kBlock32];
    table_codes(src + 1, kMxfp4DoubledValues, codes);
    for (int j = 0; j < kBlock32; ++j) y[j] = d * static_cast<float>(codes[j]);
  }
}

// MXFP4 row . q8_0 row: per block an integer dot of the doubled E2M1 values
// with the q8 codes, scaled by the half scale times d_x.
float vec_dot_mxfp4(int64_t n, const uint8_t* w, const void* xv) {
  const BlockQ8_0* x = static_cast<const BlockQ8_0*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kBlock32; ++i, w += kMxfp4Bytes) {
    int32_t codes[kBlock32];
    table_codes(w + 1, kMxfp4DoubledValues, codes);
    sum += static_cast<float>(dot_codes(codes, x[i].qs)) * (e8m0_half_scale(w[0]) * x[i].d);
  }
  return sum;
}

// A row of MXFP4 blocks in the int8 GEMM's form: the doubled E2M1 values
// (signed) and the half scale.
void int8_unpack_row_mxfp4(const uint8_t* src, void* dst, int64_t n) {
  Int8Block32* out = static_cast<Int8Block32*>(dst);
  for (int64_t i = 0; i < n / kBlock32; ++i, src += kMxfp4Bytes) {
    int32_t codes[kBlock32];
    table_codes(src + 1, kMxfp4DoubledValues, codes);
    write_int8_block(codes, e8m0_half_scale(src[0]), 0.0f, out[i]);
  }
}

}  // namespace block32
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
