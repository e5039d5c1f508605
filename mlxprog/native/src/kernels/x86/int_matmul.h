// x86 (AVX2): the exact integer matmul's micro-kernels for 16- and 32-bit
// lanes (vpmullw / vpmulld with adds); 64-bit lanes stay portable's scalars.
#pragma once

#include <immintrin.h>

#include "kernels/portable/int_matmul.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace x86 {

// 6 x 16 uint32 lanes: 12 accumulators, two B vectors and a broadcast A
// element hold 15 of the 16 ymm registers.
void int_micro_u32(int64_t kc, const uint32_t* a, const uint32_t* b, uint32_t* c, int64_t ldc) {
  __m256i acc[6][2];
  for (int i = 0; i < 6; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
  for (int64_t k = 0; k < kc; ++k, a += 6, b += 16) {
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 8));
    for (int i = 0; i < 6; ++i) {
      const __m256i ai = _mm256_set1_epi32(static_cast<int32_t>(a[i]));
      acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_mullo_epi32(ai, b0));
      acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_mullo_epi32(ai, b1));
    }
  }
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 2; ++j) {
      __m256i* dst = reinterpret_cast<__m256i*>(c + i * ldc + 8 * j);
      _mm256_storeu_si256(dst, _mm256_add_epi32(_mm256_loadu_si256(dst), acc[i][j]));
    }
}

// 6 x 32 uint16 lanes, as the uint32 kernel with twice the lanes (vpmullw
// keeps the low 16 bits of each product, all that a 16-bit result needs).
void int_micro_u16(int64_t kc, const uint16_t* a, const uint16_t* b, uint16_t* c, int64_t ldc) {
  __m256i acc[6][2];
  for (int i = 0; i < 6; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
  for (int64_t k = 0; k < kc; ++k, a += 6, b += 32) {
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
    for (int i = 0; i < 6; ++i) {
      const __m256i ai = _mm256_set1_epi16(static_cast<int16_t>(a[i]));
      acc[i][0] = _mm256_add_epi16(acc[i][0], _mm256_mullo_epi16(ai, b0));
      acc[i][1] = _mm256_add_epi16(acc[i][1], _mm256_mullo_epi16(ai, b1));
    }
  }
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 2; ++j) {
      __m256i* dst = reinterpret_cast<__m256i*>(c + i * ldc + 16 * j);
      _mm256_storeu_si256(dst, _mm256_add_epi16(_mm256_loadu_si256(dst), acc[i][j]));
    }
}

constexpr IntMatmulTiles int_matmul_tiles = {
    {6, 32, int_micro_u16},
    {6, 16, int_micro_u32},
    {4, 4, portable::int_micro_u64},
};

}  // namespace x86
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
