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

// TQ1_0's weights: visit(k, q) for each of a block's 256 weights k and its
// digit q in {0, 1, 2}.
struct Tq1Weights {
  template <class Visit>
  static void visit(const uint8_t* block, Visit each) {
    visit_tq1_span<32, 5>(block, 0, each);
    visit_tq1_span<16, 5>(block + 32, 160, each);
    visit_tq1_span<4, 4>(block + 48, 240, each);
  }
};

// TQ1_0's row dequantizer, dot product and int8 unpacker.
using Tq1Kernels = TernaryKernels<kTq1Bytes, kTq1DOffset, Tq1Weights>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
