// portable: the exact integer matmul's micro-kernels (IntMatmulTiles, whose
// blocking driver is primitives/int_matmul_driver.h): the compilers' 16-byte
// vectors for 16- and 32-bit lanes, scalars for 64-bit ones.
#pragma once

#include <cstring>

#include "kernels.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace portable {

// On the compiler's 16-byte vectors (GCC and Clang vector extensions, whose
// element arithmetic on unsigned lanes wraps, with no integer promotion):
// SSE2's and NEON's registers, the baselines of x86-64 and arm64. MR x NR / L
// = 8 accumulators for the sizes used.
template <class U, int MR, int NR>
void int_micro(int64_t kc, const U* a, const U* b, U* c, int64_t ldc) {
  typedef U V __attribute__((vector_size(16)));
  constexpr int L = 16 / sizeof(U), NV = NR / L;
  static_assert(NV * L == NR, "NR is a whole number of vectors");
  V acc[MR][NV] = {};
  for (int64_t k = 0; k < kc; ++k, a += MR, b += NR) {
    V bv[NV];
    std::memcpy(bv, b, sizeof(bv));
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < NV; ++v) acc[i][v] += a[i] * bv[v];
  }
  for (int i = 0; i < MR; ++i) {
    V row[NV];
    std::memcpy(row, c + i * ldc, sizeof(row));
    for (int v = 0; v < NV; ++v) row[v] += acc[i][v];
    std::memcpy(c + i * ldc, row, sizeof(row));
  }
}

// 4 x 4 uint64 lanes as scalars (uint64_t arithmetic wraps as it is), for
// every table: 64-bit products on SSE2 or AVX2 vectors are each built from
// three 32-bit ones, which measured half as fast as imul.
void int_micro_u64(int64_t kc, const uint64_t* a, const uint64_t* b, uint64_t* c, int64_t ldc) {
  uint64_t acc[4][4] = {};
  for (int64_t k = 0; k < kc; ++k, a += 4, b += 4)
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) c[i * ldc + j] += acc[i][j];
}

constexpr IntMatmulTiles int_matmul_tiles = {
    {4, 16, int_micro<uint16_t, 4, 16>},
    {4, 8, int_micro<uint32_t, 4, 8>},
    {4, 4, int_micro_u64},
};

}  // namespace portable
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
