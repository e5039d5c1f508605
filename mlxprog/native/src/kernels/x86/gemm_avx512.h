// x86 (AVX512): the float32 GEMM's 8 x 32 register tile on 512-bit FMAs, for
// the avx2+avx512vnni table (whose other kernels keep AVX2's 256-bit
// vectors); the blocking is portable/gemm.h's, the few-row dot products
// x86/gemm.h's.
#pragma once

#include <immintrin.h>

#include "kernels/x86/gemm.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace x86 {

struct Avx512GemmTile : Avx2GemmTile {
  // 16 zmm accumulators + 2 B vectors + 1 broadcast of 32 zmm: per step 10
  // loads feed 16 FMAs, twice the AVX2 tile's work per instruction.
  static constexpr int MR = 8, NR = 32;

  // tile (MR x NR, row stride ldc) = (accumulate ? tile : 0) + a @ b over kc
  // steps of packed micro-panels; after K's last slice (`end` given) its
  // epilogue is applied before the store. `half`: only the tile's first 16
  // columns are C's (a panel of 16 or fewer columns, common as a layer's
  // channel count), so the others are skipped.
  template <bool half>
  static void multiply_panels(int64_t kc, const float* a, int64_t lda, const float* b, float* tile,
                              int64_t ldc, bool accumulate, const TileEnd* end);

  static void multiply(int64_t kc, const float* a, int64_t lda, const float* b, float* tile,
                       int64_t ldc, bool accumulate, const TileEnd* end);

  // An overhanging tile (rows x cols of C): multiply_edge_in_halves.
  static bool multiply_edge(int64_t kc, const float* a, int64_t lda, const float* b, int64_t rows,
                            int64_t cols, float* tile, int64_t ldc, bool accumulate,
                            const TileEnd* end, float* edge);
};

template <bool half>
void Avx512GemmTile::multiply_panels(int64_t kc, const float* a, int64_t lda, const float* b,
                                     float* tile, int64_t ldc, bool accumulate,
                                     const TileEnd* end) {
  __m512 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const float* row[MR];
  for (int r = 0; r < MR; ++r) row[r] = a + r * lda;
  for (int64_t k = 0; k < kc; ++k, b += NR) {
    const __m512 b0 = _mm512_loadu_ps(b);
    const __m512 b1 = half ? b0 : _mm512_loadu_ps(b + 16);
    for (int r = 0; r < MR; ++r) {
      const __m512 x = _mm512_set1_ps(row[r][k]);
      acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
      if (!half) acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
    }
  }
  const __m512 zero = _mm512_setzero_ps();
  const float* bias = end ? end->bias : nullptr;
  const float* residual = end ? end->residual : nullptr;
  const bool relu = end && end->activation == Activation::relu;
  const __m512 bias0 = bias ? _mm512_loadu_ps(bias) : zero;
  const __m512 bias1 = bias && !half ? _mm512_loadu_ps(bias + 16) : zero;
  for (int r = 0; r < MR; ++r, tile += ldc) {
    for (int h = 0; h < (half ? 1 : 2); ++h) {
      __m512 v = acc[r][h];
      if (accumulate) v = _mm512_add_ps(v, _mm512_loadu_ps(tile + 16 * h));
      if (bias) v = _mm512_add_ps(v, h ? bias1 : bias0);
      if (residual) v = _mm512_add_ps(v, _mm512_loadu_ps(residual + r * ldc + 16 * h));
      if (relu) v = _mm512_max_ps(zero, v);  // zero first: a NaN stays NaN, as in finish
      _mm512_storeu_ps(tile + 16 * h, v);
    }
  }
}

void Avx512GemmTile::multiply(int64_t kc, const float* a, int64_t lda, const float* b, float* tile,
                              int64_t ldc, bool accumulate, const TileEnd* end) {
  multiply_panels<false>(kc, a, lda, b, tile, ldc, accumulate, end);
}

bool Avx512GemmTile::multiply_edge(int64_t kc, const float* a, int64_t lda, const float* b,
                                   int64_t rows, int64_t cols, float* tile, int64_t ldc,
                                   bool accumulate, const TileEnd* end, float* edge) {
  return multiply_edge_in_halves<Avx512GemmTile>(kc, a, lda, b, rows, cols, tile, ldc,
                                                 accumulate, end, edge);
}

}  // namespace x86
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
