// portable Q8_0 (8.5 bits/weight): per 32, an fp16 d and 32 int8 codes q;
// w = d * q.
#pragma once

#include "block32.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace block32 {

// A row of Q8_0 blocks to float32, as gguf computes it.
void dequantize_row_q8_0(const uint8_t* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kBlock32; ++i, src += kQ8_0Bytes, y += kBlock32) {
    const float d = load_fp16(src);
    for (int j = 0; j < kBlock32; ++j)
      y[j] = d * static_cast<float>(static_cast<int8_t>(src[2 + j]));
  }
}

// Q8_0 row . q8_0 row: per block an integer dot of the two blocks' codes,
// scaled by d_w * d_x.
float vec_dot_q8_0(int64_t n, const uint8_t* w, const void* xv) {
  const BlockQ8_0* x = static_cast<const BlockQ8_0*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kBlock32; ++i, w += kQ8_0Bytes) {
    int32_t dot = 0;
    for (int j = 0; j < kBlock32; ++j) dot += static_cast<int8_t>(w[2 + j]) * x[i].qs[j];
    sum += static_cast<float>(dot) * (load_fp16(w) * x[i].d);
  }
  return sum;
}

// A row of Q8_0 blocks in the int8 GEMM's form: the signed codes as they
// are.
void int8_unpack_row_q8_0(const uint8_t* src, void* dst, int64_t n) {
  Int8Block32* out = static_cast<Int8Block32*>(dst);
  for (int64_t i = 0; i < n / kBlock32; ++i, src += kQ8_0Bytes) {
    std::memcpy(out[i].codes, src + 2, kBlock32);
    out[i].d = load_fp16(src);
    out[i].m = 0.0f;
  }
}

}  // namespace block32
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
