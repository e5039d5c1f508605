// portable: the float32 GEMM and convolutions (GemmProblem, DepthwiseProblem)
// and the portable register tile. The blocking, packing and epilogue are
// written once, over a `Tile` type (its MR x NR register tile and
// micro-kernel, and the dot products of the few-row path): the plain C++
// GemmTile below, or x86/gemm.h's and x86/gemm_avx512.h's.
//
// The GEMM is organised as GotoBLAS/BLIS-style loops: for each NC-wide
// column block and KC-deep slice, that slice of B is packed into NR-wide
// micro-panels (k-major, zero-padded to whole panels), then each MC-row block
// of A into MR-tall ones; a register-blocked micro-kernel multiplies one A
// micro-panel by one B micro-panel into an MR x NR tile of C (the first slice
// stores, later ones add). Packing reads A and B through any element
// strides, and for a convolution gathers A's patches straight from the input
// (implicit im2col), so no operand is copied in full. An A micro-panel keeps
// its rows whole (row r's kc values at r * kc; the micro-kernel broadcasts
// from MR row pointers), so that gather copies runs of channels rather than
// transposing them. A B micro-panel (KC x NR) stays in L1 while the
// micro-kernel walks the A block (MC x KC, in L2).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/portable/vec.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace portable {

// Pack A's rows [m0, m0 + mc) x columns [k0, k0 + kc) into MR-tall
// micro-panels: panel i holds element (m0 + i * MR + r, k0 + k) at r * kc + k;
// rows past the block are zeros.
template <class Tile>
void pack_a_strided(const GemmProblem& p, int64_t m0, int64_t mc, int64_t k0, int64_t kc,
                    float* dst) {
  for (int64_t i = 0; i < mc; i += Tile::MR, dst += Tile::MR * kc) {
    for (int r = 0; r < Tile::MR; ++r) {
      if (i + r >= mc) {
        std::memset(dst + r * kc, 0, kc * sizeof(float));
        continue;
      }
      const float* src = p.a + (m0 + i + r) * p.a_rs + k0 * p.a_cs;
      if (p.a_cs == 1) {
        std::memcpy(dst + r * kc, src, kc * sizeof(float));
      } else {
        for (int64_t k = 0; k < kc; ++k) dst[r * kc + k] = src[k * p.a_cs];
      }
    }
  }
}

// As pack_a_strided, for A the patch matrix of p.conv (see ConvGeometry):
// each row's run of channels under one tap is copied, or zeroed where the
// tap falls in the padding. The runs of the slice [k0, k0 + kc) are listed
// once (tap offsets, channel, length), so rows only add and compare. Where
// one group reads every channel and the kernel's last axis is not dilated,
// the runs of that axis's consecutive taps are one span of the input (a
// stem convolution's 3 channels x 7 taps: one copy, not seven), copied
// whole where the span lies inside the input and tap by tap at its edges.
template <class Tile>
void pack_a_conv(const GemmProblem& p, int64_t m0, int64_t mc, int64_t k0, int64_t kc,
                 float* dst) {
  const ConvGeometry& g = *p.conv;
  const int64_t cg = g.group_channels;
  const int64_t in_pixels = g.in[0] * g.in[1] * g.in[2];
  struct Run {
    int64_t k, length, channel, offset[3];  // offset: the first tap's position in the window
    int64_t taps;                           // consecutive taps along the last axis
  };
  Run runs[kGemmKC];
  int n_runs = 0;
  const bool spans = cg == g.channels && g.dilation[2] == 1;
  for (int64_t k = k0; k < k0 + kc;) {
    int64_t tap = k / cg;
    Run run;
    run.k = k - k0;
    run.channel = k - tap * cg;
    run.length = imin(cg - run.channel, k0 + kc - k);
    run.taps = 1;
    for (int d = 2; d >= 0; --d) {
      run.offset[d] = (tap % g.kernel[d]) * g.dilation[d];
      tap /= g.kernel[d];
    }
    k += run.length;
    Run* last = n_runs ? &runs[n_runs - 1] : nullptr;
    if (spans && last && run.channel == 0 && last->offset[0] == run.offset[0] &&
        last->offset[1] == run.offset[1] && last->offset[2] + last->taps == run.offset[2] &&
        last->channel + last->length == last->taps * cg) {
      last->length += run.length;
      ++last->taps;
    } else {
      runs[n_runs++] = run;
    }
  }
  for (int64_t i = 0; i < mc; i += Tile::MR, dst += Tile::MR * kc) {
    for (int r = 0; r < Tile::MR; ++r) {
      if (i + r >= mc) {
        std::memset(dst + r * kc, 0, kc * sizeof(float));
        continue;
      }
      // The output pixel of this row, and where its window starts.
      int64_t m = m0 + i + r, start[3];
      for (int d = 2; d >= 0; --d) {
        start[d] = (m % g.out[d]) * g.stride[d] - g.pad[d];
        m /= g.out[d];
      }
      const float* image = p.a + m * in_pixels * g.channels;
      for (int j = 0; j < n_runs; ++j) {
        const Run& run = runs[j];
        const int64_t p0 = start[0] + run.offset[0], p1 = start[1] + run.offset[1],
                      p2 = start[2] + run.offset[2];
        float* out = dst + r * kc + run.k;
        if (p0 < 0 || p0 >= g.in[0] || p1 < 0 || p1 >= g.in[1]) {
          std::memset(out, 0, run.length * sizeof(float));
          continue;
        }
        const float* line = image + (p0 * g.in[1] + p1) * g.in[2] * g.channels + run.channel;
        if (p2 >= 0 && p2 + run.taps <= g.in[2]) {
          std::memcpy(out, line + p2 * g.channels, run.length * sizeof(float));
          continue;
        }
        // The span's taps one by one (piece t: its floats [from, to) in the run).
        for (int64_t t = 0; t < run.taps; ++t) {
          const int64_t from = t ? t * cg - run.channel : 0;
          const int64_t to = imin(run.length, (t + 1) * cg - run.channel);
          // The span is one run of the input, so piece t starts `from` floats in.
          if (p2 + t >= 0 && p2 + t < g.in[2])
            std::memcpy(out + from, line + p2 * g.channels + from, (to - from) * sizeof(float));
          else
            std::memset(out + from, 0, (to - from) * sizeof(float));
        }
      }
    }
  }
}

// Pack B's rows [k0, k0 + kc) x columns [n0, n0 + nc) into NR-wide
// micro-panels: panel j holds element (k0 + k, n0 + j * NR + c) at
// k * NR + c; columns past the block are zeros.
template <class Tile>
void pack_b(const GemmProblem& p, int64_t k0, int64_t kc, int64_t n0, int64_t nc, float* dst) {
  for (int64_t j = 0; j < nc; j += Tile::NR, dst += Tile::NR * kc) {
    const int64_t cols = imin(Tile::NR, nc - j);
    const float* src = p.b + k0 * p.b_rs + (n0 + j) * p.b_cs;
    if (p.b_cs == 1 && cols == Tile::NR) {
      for (int64_t k = 0; k < kc; ++k) std::memcpy(dst + k * Tile::NR, src + k * p.b_rs, Tile::NR * 4);
      continue;
    }
    // Column by column: for B transposed (b_rs == 1) each column is a dense run.
    for (int64_t c = 0; c < Tile::NR; ++c) {
      if (c >= cols) {
        for (int64_t k = 0; k < kc; ++k) dst[k * Tile::NR + c] = 0.f;
        continue;
      }
      const float* col = src + c * p.b_cs;
      for (int64_t k = 0; k < kc; ++k) dst[k * Tile::NR + c] = col[k * p.b_rs];
    }
  }
}

// The epilogue of one tile of C, applied after K's last slice: `bias` points
// at the tile's first column's, `residual` at its first element (with C's
// row stride); null ones are not applied.
struct TileEnd {
  const float* bias;
  const float* residual;
  Activation activation;
};

// The tile's end at C's rows from m, columns from n (p's epilogue there).
inline TileEnd tile_end(const GemmProblem& p, int64_t m, int64_t n) {
  const Epilogue& e = p.epilogue;
  return {e.bias ? e.bias + n : nullptr, e.residual ? e.residual + m * p.c_rs + n : nullptr,
          e.activation};
}

// One finished value, at row r and column c of the tile `end` describes
// (row stride ldc): plus its bias and residual, through the activation.
inline float finish(float v, const TileEnd& end, int64_t r, int64_t c, int64_t ldc) {
  if (end.bias) v += end.bias[c];
  if (end.residual) v += end.residual[r * ldc + c];
  return end.activation == Activation::relu && v < 0.f ? 0.f : v;
}

// The portable register tile: 4 x 8 on the compilers' generic 4-lane vectors
// (SSE2 on x86-64, NEON on arm64), what the baseline's 16 vector registers
// hold (plain loops over the tile spilled the accumulators).
struct GemmTile {
  static constexpr int MR = 4, NR = 8;
  typedef float Lanes __attribute__((vector_size(16)));

  // tile (MR x NR, row stride ldc) = (accumulate ? tile : 0) + a @ b over kc
  // steps of packed micro-panels; after K's last slice (`end` given) its
  // epilogue is applied before the store.
  static void multiply(int64_t kc, const float* a, int64_t lda, const float* b, float* tile,
                       int64_t ldc, bool accumulate, const TileEnd* end);

  // A tile that overhangs C (rows x cols of it, fewer than MR x NR): whole
  // into `edge` (MR x NR, row stride NR), which multiply_block clips into C;
  // true where the tile went straight into C instead (never, here).
  static bool multiply_edge(int64_t kc, const float* a, int64_t lda, const float* b, int64_t,
                            int64_t, float*, int64_t, bool, const TileEnd*, float* edge);

  // out[j] = a . (b + j * stride) over n values, for j < columns.
  static void column_dots(const float* a, const float* b, int64_t stride, int64_t n,
                          int64_t columns, float* out);
};

void GemmTile::multiply(int64_t kc, const float* a, int64_t lda, const float* b, float* tile,
                        int64_t ldc, bool accumulate, const TileEnd* end) {
  static_assert(NR == 8, "two 4-lane vectors per row");
  Lanes acc[MR][2] = {};
  for (int64_t k = 0; k < kc; ++k, b += NR) {
    Lanes b0, b1;
    std::memcpy(&b0, b, sizeof b0);
    std::memcpy(&b1, b + 4, sizeof b1);
    for (int r = 0; r < MR; ++r) {
      const float x = a[r * lda + k];
      acc[r][0] += x * b0;
      acc[r][1] += x * b1;
    }
  }
  for (int r = 0; r < MR; ++r, tile += ldc)
    for (int c = 0; c < NR; ++c) {
      float v = acc[r][c / 4][c % 4];
      if (accumulate) v += tile[c];
      tile[c] = end ? finish(v, *end, r, c, ldc) : v;
    }
}

bool GemmTile::multiply_edge(int64_t kc, const float* a, int64_t lda, const float* b, int64_t,
                             int64_t, float*, int64_t, bool, const TileEnd*, float* edge) {
  multiply(kc, a, lda, b, edge, NR, false, nullptr);
  return false;
}

void GemmTile::column_dots(const float* a, const float* b, int64_t stride, int64_t n,
                           int64_t columns, float* out) {
  for (int64_t j = 0; j < columns; ++j) out[j] = Vec::dot(a, b + j * stride, n);
}

// Rows [m0, m1) x columns [n0, n1) without packing, for a row or two (a
// matrix-vector product is bound by reading B, which packing would read
// once more and the micro-kernel's tile would mostly waste): dot products
// with B's columns where they are dense (the tile's column_dots), else sums
// of B's rows.
template <class Tile>
void sgemm_few_rows(const GemmProblem& p, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  for (int64_t m = m0; m < m1; ++m) {
    const float* a = p.a + m * p.a_rs;
    float* out = p.c + m * p.c_rs;
    const TileEnd end = tile_end(p, m, 0);
    if (p.b_rs == 1 && p.a_cs == 1) {
      // 64 columns at a time (a multiple of 4, so a tile's groups of columns
      // fall as they would over the whole range).
      float dots[64];
      for (int64_t n = n0; n < n1; n += 64) {
        const int64_t count = imin(64, n1 - n);
        Tile::column_dots(a, p.b + n * p.b_cs, p.b_cs, p.K, count, dots);
        for (int64_t j = 0; j < count; ++j) out[n + j] = finish(dots[j], end, 0, n + j, p.c_rs);
      }
      continue;
    }
    for (int64_t n = n0; n < n1; ++n) out[n] = 0.f;
    for (int64_t k = 0; k < p.K; ++k) {
      const float x = a[k * p.a_cs];
      const float* b = p.b + k * p.b_rs;
      if (p.b_cs == 1) {
        for (int64_t n = n0; n < n1; ++n) out[n] += x * b[n];
      } else {
        for (int64_t n = n0; n < n1; ++n) out[n] += x * b[n * p.b_cs];
      }
    }
    if (!p.epilogue.empty())
      for (int64_t n = n0; n < n1; ++n) out[n] = finish(out[n], end, 0, n, p.c_rs);
  }
}

// C's block rows [ic, ic + mc) x columns [jc, jc + nc) (+)= the A block
// (mc x kc, row r at a_block + r * lda: packed, or A itself) @ the packed B
// slice (kc x nc), tile by tile; `last`: the slice is K's last, after which
// the epilogue finishes each tile.
template <class Tile>
void multiply_block(const GemmProblem& p, const float* a_block, int64_t lda, const float* b_slice,
                    int64_t ic, int64_t mc, int64_t jc, int64_t nc, int64_t kc, bool accumulate,
                    bool last) {
  float edge[Tile::MR * Tile::NR];  // a tile that overhangs C, computed whole then clipped
  for (int64_t jr = 0; jr < nc; jr += Tile::NR) {
    const int64_t cols = imin(Tile::NR, nc - jr);
    const float* b = b_slice + jr * kc;
    for (int64_t ir = 0; ir < mc; ir += Tile::MR) {
      const int64_t rows = imin(Tile::MR, mc - ir);
      float* tile = p.c + (ic + ir) * p.c_rs + jc + jr;
      const TileEnd end = tile_end(p, ic + ir, jc + jr);
      if (rows == Tile::MR && cols == Tile::NR) {
        Tile::multiply(kc, a_block + ir * lda, lda, b, tile, p.c_rs, accumulate,
                       last ? &end : nullptr);
        continue;
      }
      if (Tile::multiply_edge(kc, a_block + ir * lda, lda, b, rows, cols, tile, p.c_rs,
                              accumulate, last ? &end : nullptr, edge))
        continue;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          float v = edge[r * Tile::NR + c];
          if (accumulate) v += tile[r * p.c_rs + c];
          tile[r * p.c_rs + c] = last ? finish(v, end, r, c, p.c_rs) : v;
        }
    }
  }
}

template <class Tile>
void pack_a(const GemmProblem& p, int64_t m0, int64_t mc, int64_t k0, int64_t kc, float* dst) {
  if (p.conv)
    pack_a_conv<Tile>(p, m0, mc, k0, kc, dst);
  else
    pack_a_strided<Tile>(p, m0, mc, k0, kc, dst);
}

template <class Tile>
void sgemm(const GemmProblem& p, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* work,
           const float* packed_b_whole) {
  static_assert(kGemmMC % Tile::MR == 0 && kGemmNC % Tile::NR == 0,
                "cache blocks must hold whole tiles");
  if (m0 >= m1 || n0 >= n1) return;
  if (p.K == 0) {  // an empty sum
    const TileEnd end = tile_end(p, 0, 0);
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t n = n0; n < n1; ++n) p.c[m * p.c_rs + n] = finish(0.f, end, m, n, p.c_rs);
    return;
  }
  if (m1 - m0 <= 2 && !p.conv && !packed_b_whole) {
    sgemm_few_rows<Tile>(p, m0, m1, n0, n1);
    return;
  }
  // 64-byte aligned panels: the micro-kernel's loads never split a cache line.
  float* packed_a =
      reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(work) + 63) & ~uintptr_t(63));
  float* packed_b = packed_a + kGemmMC * kGemmKC;
  // The A block of rows [ic, ic + mc) x columns [pc, pc + kc), and its row
  // stride: A itself where its rows are dense and the block holds whole
  // register tiles (the micro-kernel reads rows whole either way, so a
  // copy would only cost: a pointwise convolution's A is its input), else
  // packed.
  struct ABlock {
    const float* a;
    int64_t lda;
  };
  auto a_block = [&](int64_t ic, int64_t mc, int64_t pc, int64_t kc) -> ABlock {
    if (!p.conv && p.a_cs == 1 && mc % Tile::MR == 0) return {p.a + ic * p.a_rs + pc, p.a_rs};
    pack_a<Tile>(p, ic, mc, pc, kc, packed_a);
    return {packed_a, kc};
  };
  for (int64_t jc = n0; jc < n1; jc += kGemmNC) {
    const int64_t nc = imin(kGemmNC, n1 - jc);
    if (packed_b_whole && p.K * nc <= 64 * 1024) {
      // Every slice of B is at hand and all of them fit in L2 (half of its
      // 512 KiB): finish a row block over all of K before the next, so its
      // block of C stays in cache instead of being read and written again
      // for each slice (much of the traffic when N is small). A larger B
      // would instead stream from L3 for every row block.
      for (int64_t ic = m0; ic < m1; ic += kGemmMC) {
        const int64_t mc = imin(kGemmMC, m1 - ic);
        for (int64_t pc = 0; pc < p.K; pc += kGemmKC) {
          const int64_t kc = imin(kGemmKC, p.K - pc);
          const ABlock a = a_block(ic, mc, pc, kc);
          multiply_block<Tile>(p, a.a, a.lda, packed_b_whole + pc * gemm_packed_cols(p.N) + jc * kc,
                         ic, mc, jc, nc, kc, pc > 0, pc + kc == p.K);
        }
      }
      continue;
    }
    for (int64_t pc = 0; pc < p.K; pc += kGemmKC) {
      const int64_t kc = imin(kGemmKC, p.K - pc);
      const float* b_slice = packed_b;
      if (packed_b_whole)
        b_slice = packed_b_whole + pc * gemm_packed_cols(p.N) + jc * kc;
      else
        pack_b<Tile>(p, pc, kc, jc, nc, packed_b);
      for (int64_t ic = m0; ic < m1; ic += kGemmMC) {
        const int64_t mc = imin(kGemmMC, m1 - ic);
        const ABlock a = a_block(ic, mc, pc, kc);
        multiply_block<Tile>(p, a.a, a.lda, b_slice, ic, mc, jc, nc, kc, pc > 0, pc + kc == p.K);
      }
    }
  }
}

// -- depthwise convolution ---------------------------------------------------------

// out[row, o2, :] = sum over taps inside the input of x[pixel, :] * taps[tap, :]:
// every step is a channel vector, so the loops vectorize across channels.
void depthwise_conv(const DepthwiseProblem& p, int64_t r0, int64_t r1) {
  const ConvGeometry& g = p.g;
  const int64_t C = g.channels;
  for (int64_t row = r0; row < r1; ++row) {
    const int64_t o1 = row % g.out[1], o0 = (row / g.out[1]) % g.out[0];
    const int64_t n = row / (g.out[1] * g.out[0]);
    const float* image = p.x + n * g.in[0] * g.in[1] * g.in[2] * C;
    for (int64_t o2 = 0; o2 < g.out[2]; ++o2) {
      float* out = p.out + (row * g.out[2] + o2) * C;
      for (int64_t c = 0; c < C; ++c) out[c] = 0.f;
      const float* taps = p.taps;
      for (int64_t t0 = 0; t0 < g.kernel[0]; ++t0) {
        const int64_t i0 = o0 * g.stride[0] - g.pad[0] + t0 * g.dilation[0];
        if (i0 < 0 || i0 >= g.in[0]) {
          taps += g.kernel[1] * g.kernel[2] * C;
          continue;
        }
        for (int64_t t1 = 0; t1 < g.kernel[1]; ++t1) {
          const int64_t i1 = o1 * g.stride[1] - g.pad[1] + t1 * g.dilation[1];
          if (i1 < 0 || i1 >= g.in[1]) {
            taps += g.kernel[2] * C;
            continue;
          }
          for (int64_t t2 = 0; t2 < g.kernel[2]; ++t2, taps += C) {
            const int64_t i2 = o2 * g.stride[2] - g.pad[2] + t2 * g.dilation[2];
            if (i2 < 0 || i2 >= g.in[2]) continue;
            const float* src = image + ((i0 * g.in[1] + i1) * g.in[2] + i2) * C;
            for (int64_t c = 0; c < C; ++c) out[c] += src[c] * taps[c];
          }
        }
      }
      if (!p.epilogue.empty()) {
        const Epilogue& e = p.epilogue;
        const TileEnd end = {e.bias, e.residual ? e.residual + (out - p.out) : nullptr,
                             e.activation};
        for (int64_t c = 0; c < C; ++c) out[c] = finish(out[c], end, 0, c, C);
      }
    }
  }
}

}  // namespace portable
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
