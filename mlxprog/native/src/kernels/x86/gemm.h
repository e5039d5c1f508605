// x86 (AVX2+FMA): the float32 GEMM's 6 x 16 register tile and its few-row
// dot products, which the blocking in portable/gemm.h runs with
// (portable::sgemm<x86::Avx2GemmTile>).
#pragma once

#include <immintrin.h>

#include "kernels/portable/gemm.h"
#include "kernels/x86/vec.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace x86 {

// out[j] = a . (b + j * stride) over n values, for j < 4: four dot products
// in one pass over a, their streams of B read side by side (a layer's
// weight seen transposed, read once per token: bound by memory, which
// four streams keep busier than one).
void dot4(const float* a, const float* b, int64_t stride, int64_t n, float* out) {
  __m256 acc[4][2];
  for (auto& pair : acc) pair[0] = pair[1] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 x0 = _mm256_loadu_ps(a + i), x1 = _mm256_loadu_ps(a + i + 8);
    for (int j = 0; j < 4; ++j) {
      acc[j][0] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(b + j * stride + i), acc[j][0]);
      acc[j][1] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(b + j * stride + i + 8), acc[j][1]);
    }
  }
  for (int j = 0; j < 4; ++j) {
    float total = hsum(_mm256_add_ps(acc[j][0], acc[j][1]));
    for (int64_t k = i; k < n; ++k) total += a[k] * b[j * stride + k];
    out[j] = total;
  }
}

struct Avx2GemmTile {
  // 12 accumulators + 2 B vectors + 1 broadcast of the 16 ymm registers.
  static constexpr int MR = 6, NR = 16;
  using TileEnd = portable::TileEnd;

  // tile (MR x NR, row stride ldc) = (accumulate ? tile : 0) + a @ b over kc
  // steps of packed micro-panels; after K's last slice (`end` given) its
  // epilogue is applied before the store. `half`: only the tile's first 8
  // columns are C's (a prompt of 8 rows past a multiple of 16, as half the
  // prefill buckets are), so the others are skipped.
  template <bool half>
  static void multiply_panels(int64_t kc, const float* a, int64_t lda, const float* b,
                              float* tile, int64_t ldc, bool accumulate, const TileEnd* end);

  static void multiply(int64_t kc, const float* a, int64_t lda, const float* b, float* tile,
                       int64_t ldc, bool accumulate, const TileEnd* end);

  // An overhanging tile (rows x cols of C): multiply_edge_in_halves.
  static bool multiply_edge(int64_t kc, const float* a, int64_t lda, const float* b, int64_t rows,
                            int64_t cols, float* tile, int64_t ldc, bool accumulate,
                            const TileEnd* end, float* edge);

  // out[j] = a . (b + j * stride) over n values, for j < columns: four
  // columns at a time (dot4), the rest one by one.
  static void column_dots(const float* a, const float* b, int64_t stride, int64_t n,
                          int64_t columns, float* out);
};

template <bool half>
void Avx2GemmTile::multiply_panels(int64_t kc, const float* a, int64_t lda, const float* b,
                                   float* tile, int64_t ldc, bool accumulate, const TileEnd* end) {
  __m256 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const float* row[MR];
  for (int r = 0; r < MR; ++r) row[r] = a + r * lda;
  for (int64_t k = 0; k < kc; ++k, b += NR) {
    const __m256 b0 = _mm256_loadu_ps(b);
    const __m256 b1 = half ? b0 : _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256 x = _mm256_broadcast_ss(row[r] + k);
      acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
      if (!half) acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
    }
  }
  const __m256 zero = _mm256_setzero_ps();
  const float* bias = end ? end->bias : nullptr;
  const float* residual = end ? end->residual : nullptr;
  const bool relu = end && end->activation == Activation::relu;
  const __m256 bias0 = bias ? _mm256_loadu_ps(bias) : zero;
  const __m256 bias1 = bias && !half ? _mm256_loadu_ps(bias + 8) : zero;
  for (int r = 0; r < MR; ++r, tile += ldc) {
    for (int h = 0; h < (half ? 1 : 2); ++h) {
      __m256 v = acc[r][h];
      if (accumulate) v = _mm256_add_ps(v, _mm256_loadu_ps(tile + 8 * h));
      if (bias) v = _mm256_add_ps(v, h ? bias1 : bias0);
      if (residual) v = _mm256_add_ps(v, _mm256_loadu_ps(residual + r * ldc + 8 * h));
      if (relu) v = _mm256_max_ps(zero, v);  // zero first: a NaN stays NaN, as in finish
      _mm256_storeu_ps(tile + 8 * h, v);
    }
  }
}

void Avx2GemmTile::multiply(int64_t kc, const float* a, int64_t lda, const float* b, float* tile,
                            int64_t ldc, bool accumulate, const TileEnd* end) {
  multiply_panels<false>(kc, a, lda, b, tile, ldc, accumulate, end);
}

// multiply_edge of a tile whose multiply_panels<true> multiplies only its
// first NR / 2 columns (the AVX2 and AVX-512 tiles): an overhanging tile
// (rows x cols of C) of NR / 2 columns or fewer takes half the multiplies,
// straight into C where it has all MR rows and exactly NR / 2 columns;
// otherwise whole into `edge` for multiply_block to clip.
template <class Tile>
bool multiply_edge_in_halves(int64_t kc, const float* a, int64_t lda, const float* b,
                             int64_t rows, int64_t cols, float* tile, int64_t ldc,
                             bool accumulate, const portable::TileEnd* end, float* edge) {
  constexpr int64_t half = Tile::NR / 2;
  if (cols > half) {
    Tile::multiply(kc, a, lda, b, edge, Tile::NR, false, nullptr);
    return false;
  }
  if (rows == Tile::MR && cols == half) {
    Tile::template multiply_panels<true>(kc, a, lda, b, tile, ldc, accumulate, end);
    return true;
  }
  Tile::template multiply_panels<true>(kc, a, lda, b, edge, Tile::NR, false, nullptr);
  return false;
}

bool Avx2GemmTile::multiply_edge(int64_t kc, const float* a, int64_t lda, const float* b,
                                 int64_t rows, int64_t cols, float* tile, int64_t ldc,
                                 bool accumulate, const TileEnd* end, float* edge) {
  return multiply_edge_in_halves<Avx2GemmTile>(kc, a, lda, b, rows, cols, tile, ldc, accumulate,
                                               end, edge);
}

void Avx2GemmTile::column_dots(const float* a, const float* b, int64_t stride, int64_t n,
                               int64_t columns, float* out) {
  int64_t j = 0;
  for (; j + 4 <= columns; j += 4) dot4(a, b + j * stride, stride, n, out + j);
  for (; j < columns; ++j) out[j] = Vec::dot(a, b + j * stride, n);
}

}  // namespace x86
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
