// portable TQ1_0 (1.69 bits/weight, ternary): per 256, 48 + 4 bytes each
// packing 5 (or 4) base-3 digits q in {0, 1, 2} as a fixed-point fraction
// (byte = ceil(value * 256 / 243)), then an fp16 d; w = d * (q - 1).
#pragma once

#include "iq_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The base-3 digit at the top of a packed byte's fraction; multiplying the
// byte by 3^j (mod 256) first brings digit j there.
inline int32_t top_ternary_digit(uint8_t shifted) {
  return (static_cast<int32_t>(shifted) * 3) >> 8;
}

// A TQ1_0 block packs its weights in three spans, each `Bytes` bytes holding
// `Digits` digits: digit j of byte m is the span's weight Bytes * j + m
// (gguf's order). The spans: 32 bytes x 5 digits from weight 0, 16 x 5 from
// 160, and the 4 bytes at 48 with 4 digits from 240. This calls
// visit(k, q) for each weight k of one span (from `first`) and its digit q.
template <int Bytes, int Digits, class Visit>
inline void visit_tq1_span(const uint8_t* packed, int first, Visit& visit) {
  uint8_t pow3 = 1;
  for (int j = 0; j < Digits; ++j, pow3 *= 3)
    for (int m = 0; m < Bytes; ++m)
      visit(first + Bytes * j + m, top_ternary_digit(static_cast<uint8_t>(packed[m] * pow3)));
}

// visit(k, q) for each of a block's 256 weights k and its digit q in {0, 1, 2}.
template <class Visit>
inline void visit_tq1_block(const uint8_t* block, Visit visit) {
  visit_tq1_span<32, 5>(block, 0, visit);
  visit_tq1_span<16, 5>(block + 32, 160, visit);
  visit_tq1_span<4, 4>(block + 48, 240, visit);
}

// A row of TQ1_0 blocks to float32, as gguf computes it.
void dequantize_row_tq1_0(const uint8_t* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kTq1Bytes, y += kSuperBlock) {
    const float d = load_fp16(src + kTq1DOffset);
    visit_tq1_block(src, [&](int k, int32_t q) { y[k] = d * static_cast<float>(q - 1); });
  }
}

// TQ1_0 row . q8_K row (dot_ternary_row).
float vec_dot_tq1_0(int64_t n, const uint8_t* w, const void* x) {
  return dot_ternary_row<kTq1Bytes, kTq1DOffset>(
      n, w, x,
      [](const uint8_t* block, const int8_t* q8) {
        int32_t dot = 0;
        visit_tq1_block(block, [&](int k, int32_t q) { dot += q * q8[k]; });
        return dot;
      },
      load_fp16);
}

// A row of TQ1_0 blocks in the int8 GEMM's form (unpack_ternary_row).
void int8_unpack_row_tq1_0(const uint8_t* src, void* dst, int64_t n) {
  unpack_ternary_row<kTq1Bytes, kTq1DOffset>(
      src, dst, n,
      [](const uint8_t* block, int8_t* codes) {
        visit_tq1_block(block, [&](int k, int32_t q) { codes[k] = static_cast<int8_t>(q - 1); });
      },
      load_fp16);
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
