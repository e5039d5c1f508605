// x86 TQ2_0 (AVX2): the dot product with q8_K activations and the int8
// unpacker (portable/tq2_0.h has the layout; its row dequantizer is the
// portable one). Bits 2j of the 32 bytes of half g are the codes of the 32
// consecutive weights 128g + 32j: one shift and mask a vector. The block's
// integer sums and unpacked codes are the portable kernels'.
#pragma once

#include "../portable/iq_blocks.h"
#include "kquant_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace tq2_x86 {

// visit(k, codes) for the eight vectors of a block's codes (0 to 3), codes
// holding those of weights k to k + 31.
template <class Visit>
[[gnu::always_inline]] inline void visit_code_vectors(const uint8_t* block, Visit visit) {
  const __m256i two_bits = _mm256_set1_epi8(3);
  for (int g = 0; g < 2; ++g) {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * g));
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
      visit(128 * g + 32 * j, _mm256_and_si256(_mm256_srli_epi16(packed, 2 * j), two_bits));
  }
}

// TQ2_0 row . q8_K row (dot_ternary_row).
float vec_dot_tq2_0(int64_t n, const uint8_t* w, const void* x) {
  return dot_ternary_row<kTq2Bytes, kTq2DOffset>(
      n, w, x,
      [](const uint8_t* block, const int8_t* q8) {
        __m256i dot = _mm256_setzero_si256();
        visit_code_vectors(block, [&](int k, __m256i codes) {
          dot = dot_u8s8_add(dot, codes,
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + k)));
        });
        return hsum_epi32(dot);
      },
      kquant::fp16_at);
}

// A row of TQ2_0 blocks in the int8 GEMM's form (unpack_ternary_row).
void int8_unpack_row_tq2_0(const uint8_t* src, void* dst, int64_t n) {
  unpack_ternary_row<kTq2Bytes, kTq2DOffset>(
      src, dst, n,
      [](const uint8_t* block, int8_t* codes) {
        visit_code_vectors(block, [&](int k, __m256i q) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + k),
                              _mm256_sub_epi8(q, _mm256_set1_epi8(1)));
        });
      },
      kquant::fp16_at);
}

}  // namespace tq2_x86
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
