// The exact integer matmul's blocking driver, free of MLX types: C[b] =
// A[b] @ B[b] for operands of one integer dtype (int8..int64, uint8..uint64),
// wrapping modulo 2**bits like numpy, on a kernel table's micro-kernels
// (Kernels::int_matmul; kernels/*/int_matmul.h). primitives/int_matmul.cpp
// makes it an MLX primitive; tests/native/int_matmul_selftest.cpp runs it
// alone (on arm64 too).
//
// A product or sum modulo 2**bits depends only on the low `bits` bits of its
// terms, so each dtype is computed in unsigned lanes at least as wide as it
// (uint16 lanes for 8- and 16-bit dtypes, uint32, uint64), whose overflow C++
// defines as wrap-around, and the result is truncated to the dtype at the
// end; signed operands need no sign handling (two's complement is the same
// low bits).
//
// The loops are GotoBLAS-style: a job owns an output block of up to NC
// columns; for each KC-deep slice it packs that slice of B into NR-wide
// micro-panels and each MC-row block of A into MR-tall ones (converted to the
// lane type, read through any strides, zero-padded to whole tiles), and a
// micro-kernel adds an MR x NR tile of products into the job's accumulator.
// Jobs (batch element, column block, row group) run on the thread pool.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "threadpool.h"

namespace mlxprog {
namespace int_kernels {

// Block sizes, in elements. A KC x NR micro-panel of B (16 KB of uint32)
// stays in L1 while the MC x KC block of A (96 KB) streams from L2. MC and NC
// are multiples of every table's MR and NR (kernels/*/int_matmul.h).
constexpr int64_t KC = 256;
constexpr int64_t MC = 96;
constexpr int64_t NC = 256;
// A job's rows at most: its accumulator (rows x NC lanes) stays a few MB.
constexpr int64_t MAX_JOB_ROWS = 1152;
// Below this many multiply-adds a product is not split for threads (the
// wake-up costs more than the work).
constexpr int64_t MIN_SPLIT_WORK = int64_t{1} << 18;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// The lanes a dtype of T's width is computed in.
template <class T>
using Lane = std::conditional_t<sizeof(T) <= 2, uint16_t,
                                std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;

// The table's tile for lanes U.
template <class U>
const IntTile<U>& tile_for(const IntMatmulTiles& tiles);

template <>
inline const IntTile<uint16_t>& tile_for(const IntMatmulTiles& tiles) {
  return tiles.u16;
}

template <>
inline const IntTile<uint32_t>& tile_for(const IntMatmulTiles& tiles) {
  return tiles.u32;
}

template <>
inline const IntTile<uint64_t>& tile_for(const IntMatmulTiles& tiles) {
  return tiles.u64;
}

// mc rows and kc columns of A (element (i, k) at a[i * rs + k * cs]) as
// mr-row micro-panels of kc x mr lanes, rows past mc zero.
template <class T, class U>
void pack_a(const T* a, int64_t rs, int64_t cs, int64_t mc, int64_t kc, int64_t mr, U* dst) {
  for (int64_t p = 0; p < mc; p += mr, dst += kc * mr)
    for (int64_t r = 0; r < mr; ++r) {
      if (p + r < mc) {
        const T* src = a + (p + r) * rs;
        for (int64_t k = 0; k < kc; ++k) dst[k * mr + r] = static_cast<U>(src[k * cs]);
      } else {
        for (int64_t k = 0; k < kc; ++k) dst[k * mr + r] = 0;
      }
    }
}

// kc rows and nc columns of B (element (k, j) at b[k * rs + j * cs]) as
// nr-column micro-panels of kc x nr lanes, columns past nc zero.
template <class T, class U>
void pack_b(const T* b, int64_t rs, int64_t cs, int64_t kc, int64_t nc, int64_t nr, U* dst) {
  for (int64_t q = 0; q < nc; q += nr, dst += kc * nr) {
    const int64_t width = std::min(nr, nc - q);
    for (int64_t k = 0; k < kc; ++k) {
      const T* src = b + k * rs + q * cs;
      U* d = dst + k * nr;
      for (int64_t j = 0; j < width; ++j) d[j] = static_cast<U>(src[j * cs]);
      for (int64_t j = width; j < nr; ++j) d[j] = 0;
    }
  }
}

// The low bits of a lane as T (through T's unsigned type, where C++ defines
// the narrowing as modular).
template <class T, class U>
inline T wrap_to(U u) {
  return static_cast<T>(static_cast<std::make_unsigned_t<T>>(u));
}

// A batch of products: A[b] (M x K) at a + a_offsets[b] with element strides
// a_rs, a_cs; B[b] (K x N) likewise; C row-contiguous, batch after batch.
template <class T>
struct Operands {
  const T* a;
  const T* b;
  T* c;
  const int64_t* a_offsets;
  const int64_t* b_offsets;
  int64_t batch, M, N, K;
  int64_t a_rs, a_cs, b_rs, b_cs;
};

// Rows [i0, i1) and columns [j0, j1) of C[bi].
template <class T>
void run_job(const Operands<T>& p, const IntTile<Lane<T>>& t, int64_t bi, int64_t i0,
             int64_t i1, int64_t j0, int64_t j1) {
  using U = Lane<T>;
  const int64_t rows = i1 - i0, cols = j1 - j0, ldc = round_up(cols, t.nr);
  const int64_t depth = std::min(KC, p.K);
  std::vector<U> acc(round_up(rows, t.mr) * ldc, 0);
  std::vector<U> ap(round_up(std::min(MC, rows), t.mr) * depth), bp(ldc * depth);
  const T* a = p.a + p.a_offsets[bi] + i0 * p.a_rs;
  const T* b = p.b + p.b_offsets[bi] + j0 * p.b_cs;
  for (int64_t k0 = 0; k0 < p.K; k0 += KC) {
    const int64_t kc = std::min(KC, p.K - k0);
    pack_b(b + k0 * p.b_rs, p.b_rs, p.b_cs, kc, cols, t.nr, bp.data());
    for (int64_t ic = 0; ic < rows; ic += MC) {
      const int64_t mc = std::min(MC, rows - ic), mc_padded = round_up(mc, t.mr);
      pack_a(a + ic * p.a_rs + k0 * p.a_cs, p.a_rs, p.a_cs, mc, kc, t.mr, ap.data());
      // Column panels outside: one B micro-panel stays in L1 across A's.
      for (int64_t jr = 0; jr < ldc; jr += t.nr)
        for (int64_t ir = 0; ir < mc_padded; ir += t.mr)
          t.micro(kc, ap.data() + ir * kc, bp.data() + jr * kc,
                  acc.data() + (ic + ir) * ldc + jr, ldc);
    }
  }
  T* c = p.c + (bi * p.M + i0) * p.N + j0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) c[r * p.N + j] = wrap_to<T>(acc[r * ldc + j]);
}

// C = A @ B for every batch element, on `tiles`' micro-kernels (of a table
// the CPU runs).
template <class T>
void run(const Operands<T>& p, const IntMatmulTiles& tiles) {
  if (p.batch == 0 || p.M == 0 || p.N == 0) return;
  const IntTile<Lane<T>>& t = tile_for<Lane<T>>(tiles);
  const int64_t col_blocks = ceil_div(p.N, NC);
  // Row groups: enough for two jobs per thread where the batch and column
  // blocks give fewer (each group packs B again, so no more), and small
  // enough to bound a job's accumulator.
  int64_t groups = ceil_div(p.M, MAX_JOB_ROWS);
  // (work * K compared by division: the product could overflow.)
  if (p.batch * p.M * p.N >= ceil_div(MIN_SPLIT_WORK, std::max<int64_t>(p.K, 1))) {
    const int64_t wanted = ceil_div(2 * ThreadPool::instance().threads(), p.batch * col_blocks);
    groups = std::max(groups, std::min(wanted, ceil_div(p.M, t.mr)));
  }
  const int64_t group_rows = round_up(ceil_div(p.M, groups), t.mr);
  groups = ceil_div(p.M, group_rows);
  const int64_t per_batch = groups * col_blocks;
  ThreadPool::instance().parallel_for(p.batch * per_batch, 1, [&](int64_t job0, int64_t job1) {
    for (int64_t job = job0; job < job1; ++job) {
      const int64_t bi = job / per_batch, g = job % per_batch / col_blocks,
                    cb = job % col_blocks;
      run_job(p, t, bi, g * group_rows, std::min(p.M, (g + 1) * group_rows), cb * NC,
              std::min(p.N, (cb + 1) * NC));
    }
  });
}

}  // namespace int_kernels
}  // namespace mlxprog
