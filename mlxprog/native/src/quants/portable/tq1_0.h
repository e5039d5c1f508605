// portable TQ1_0 (1.69 bits/weight, ternary): per 256, 48 + 4 bytes each
// packing 5 (or 4) base-3 digits q in {0, 1, 2} as a fixed-point fraction
// (byte = ceil(value * 256 / 243)), then an fp16 d; w = d * (q - 1).
#pragma once

#include "iq_common.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

constexpr int kTq1Bytes = 54;

// The base-3 digit at the top of a packed byte's fraction; multiplying the
// byte by 3^j (mod 256) first brings digit j there.
inline int32_t top_ternary_digit(uint8_t shifted) {
  return (static_cast<int32_t>(shifted) * 3) >> 8;
}

// A TQ1_0 block packs its weights in three spans, each `Bytes` bytes holding
// `Digits` digits: digit j of byte m is the span's weight Bytes * j + m
// (gguf's order). The spans: 32 bytes x 5 digits from weight 0, 16 x 5 from
// 160, and the 4 bytes at 48 with 4 digits from 240. This writes one span's
// weights d * (q - 1) to y.
template <int Bytes, int Digits>
inline void dequantize_tq1_span(const uint8_t* packed, float d, float* y) {
  uint8_t pow3 = 1;
  for (int j = 0; j < Digits; ++j, pow3 *= 3)
    for (int m = 0; m < Bytes; ++m) {
      const int32_t q = top_ternary_digit(static_cast<uint8_t>(packed[m] * pow3));
      y[Bytes * j + m] = d * static_cast<float>(q - 1);
    }
}

// sum q * x over one span (see dequantize_tq1_span), q the digits in {0, 1, 2}.
template <int Bytes, int Digits>
inline int32_t tq1_span_dot(const uint8_t* packed, const int8_t* q8) {
  int32_t sum = 0;
  uint8_t pow3 = 1;
  for (int j = 0; j < Digits; ++j, pow3 *= 3)
    for (int m = 0; m < Bytes; ++m)
      sum += top_ternary_digit(static_cast<uint8_t>(packed[m] * pow3)) * q8[Bytes * j + m];
  return sum;
}

// A row of TQ1_0 blocks to float32, as gguf computes it.
void dequantize_row_tq1_0(const uint8_t* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kTq1Bytes, y += kSuperBlock) {
    const float d = load_fp16(src + 52);
    dequantize_tq1_span<32, 5>(src, d, y);
    dequantize_tq1_span<16, 5>(src + 32, d, y + 160);
    dequantize_tq1_span<4, 4>(src + 48, d, y + 240);
  }
}

// TQ1_0 row . q8_K row: per block sum (q - 1) * x = sum q * x - sum x in
// integers, one float product per block.
float vec_dot_tq1_0(int64_t n, const uint8_t* w, const void* xv) {
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, w += kTq1Bytes) {
    const int8_t* q8 = x[i].qs;
    const int32_t dot = tq1_span_dot<32, 5>(w, q8) + tq1_span_dot<16, 5>(w + 32, q8 + 160) +
                        tq1_span_dot<4, 4>(w + 48, q8 + 240);
    sum += load_fp16(w + 52) * x[i].d * static_cast<float>(dot - q8k_code_sum(x[i]));
  }
  return sum;
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
