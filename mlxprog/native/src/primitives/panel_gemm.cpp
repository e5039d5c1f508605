// panel_gemm: dequantized panels of weight rows multiplied by x with the
// float GEMM's register tiles, on the thread pool.
#include "primitives/panel_gemm.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "threadpool.h"

namespace mlxprog {
namespace {

// Weight rows one panel holds at most: a chunk of work for one thread, whose
// dequantized floats (kPanelRows * K) stay in L2 while x passes over them.
constexpr int64_t kPanelRows = 128;
// Weight rows dequantized together and transposed into a panel's columns.
constexpr int64_t kTransposeRows = 8;
// Up to this many rows of x, the weight rows are the GEMM's A (see
// panel_gemm_rows_as_a); from here on x is.
constexpr int64_t kRowsAsAMaxRows = 256;

// 64-byte aligned scratch of `floats` floats (sgemm's panels want it).
struct AlignedFloats {
  explicit AlignedFloats(int64_t floats) : raw(new float[floats + 16]) {}
  float* get() const {
    return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(raw.get()) + 63) & ~uintptr_t{63});
  }
  std::unique_ptr<float[]> raw;
};

// The weight rows one panel takes: the pool's threads get equal numbers of
// panels of at most kPanelRows rows (a layer's 576 rows on two threads: six
// panels of 96, not five of 128 split three to two), each a multiple of the
// register tile's rows so the GEMM reads them in place.
int64_t panel_rows(const Kernels& kernels, int64_t N) {
  const int64_t threads = ThreadPool::instance().threads();
  const int64_t per_thread = (N + threads - 1) / threads;
  const int64_t panels = threads * ((per_thread + kPanelRows - 1) / kPanelRows);
  const int64_t tile = kernels.sgemm_rows;
  const int64_t rows = ((N + panels - 1) / panels + tile - 1) / tile * tile;
  return std::max<int64_t>(tile, rows);
}

// dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols: in 4 x 4
// blocks of the compilers' generic 4-lane vectors (SSE2 on x86-64, NEON on
// arm64; a quarter of the loads and stores of the element-wise loop), the
// edges element by element.
void transpose(const float* src, int64_t rows, int64_t cols, int64_t lds, float* dst,
               int64_t ldd) {
  typedef float Lanes __attribute__((vector_size(16)));
  auto load = [](const float* p) {
    Lanes v;
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  const int64_t rows4 = rows / 4 * 4, cols4 = cols / 4 * 4;
  // dst's rows are filled left to right, four at a time: each cache line of
  // them is written whole before the next.
  for (int64_t c = 0; c < cols4; c += 4)
    for (int64_t r = 0; r < rows4; r += 4) {
      const float* s = src + r * lds + c;
      const Lanes a = load(s), b = load(s + lds), e = load(s + 2 * lds), f = load(s + 3 * lds);
      const Lanes ab_low = __builtin_shufflevector(a, b, 0, 4, 1, 5);
      const Lanes ab_high = __builtin_shufflevector(a, b, 2, 6, 3, 7);
      const Lanes ef_low = __builtin_shufflevector(e, f, 0, 4, 1, 5);
      const Lanes ef_high = __builtin_shufflevector(e, f, 2, 6, 3, 7);
      const Lanes columns[4] = {__builtin_shufflevector(ab_low, ef_low, 0, 1, 4, 5),
                                __builtin_shufflevector(ab_low, ef_low, 2, 3, 6, 7),
                                __builtin_shufflevector(ab_high, ef_high, 0, 1, 4, 5),
                                __builtin_shufflevector(ab_high, ef_high, 2, 3, 6, 7)};
      for (int i = 0; i < 4; ++i) std::memcpy(dst + (c + i) * ldd + r, &columns[i], sizeof(Lanes));
    }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = r < rows4 ? cols4 : 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

// x's transpose (K x M) packed once as the GEMM's B, as sgemm_pack_b lays
// out a whole B (K * gemm_packed_cols(M) floats).
AlignedFloats pack_x_as_b(const Kernels& kernels, const float* x, int64_t M, int64_t K) {
  AlignedFloats packed(K * gemm_packed_cols(M));
  const GemmProblem xt{nullptr, 0, 0, x, 1, K, nullptr, 0, 0, M, K, nullptr};
  for (int64_t k0 = 0; k0 < K; k0 += kGemmKC)
    kernels.sgemm_pack_b(xt, k0, std::min(kGemmKC, K - k0), 0, M,
                         packed.get() + k0 * gemm_packed_cols(M));
  return packed;
}

// For a few rows of x (a short prompt), y^T = W x^T: each panel's weight
// rows, dequantized, are the GEMM's A, read in place (dense rows), against
// x^T packed once per call, and the panel's few outputs are transposed into
// y. Each output sums the same products in the same order as with x as A
// (the tile's FMA multiplies the pair either way round), but the panel needs
// neither a transpose of its weights nor a packing of them.
void panel_gemm_rows_as_a(const Kernels& kernels, const float* x, int64_t M, int64_t K, int64_t N,
                          const RowDequantizer& dequantize_row, float* y, int64_t ldy) {
  const AlignedFloats xt = pack_x_as_b(kernels, x, M, K);
  const int64_t rows_per_panel = panel_rows(kernels, N);
  const int64_t panels = (N + rows_per_panel - 1) / rows_per_panel;
  ThreadPool::instance().parallel_for(panels, 1, [&](int64_t p0, int64_t p1) {
    // Scratch the kernels overwrite whole: no zeroing.
    AlignedFloats rows(rows_per_panel * K), out(rows_per_panel * M),
        work(gemm_workspace(M));
    for (int64_t panel_index = p0; panel_index < p1; ++panel_index) {
      const int64_t n0 = panel_index * rows_per_panel, count = std::min(rows_per_panel, N - n0);
      for (int64_t r = 0; r < count; ++r) dequantize_row(n0 + r, rows.get() + r * K);
      // out (count x M) = rows (count x K) @ x^T (K x M).
      GemmProblem problem{rows.get(), K, 1, x, 1, K, out.get(), M, count, M, K, nullptr};
      kernels.sgemm(problem, 0, count, 0, M, work.get(), xt.get());
      transpose(out.get(), count, M, M, y + n0, ldy);
    }
  });
}

}  // namespace

void panel_gemm(const Kernels& kernels, const float* x, int64_t M, int64_t K, int64_t N,
                const RowDequantizer& dequantize_row, float* y, int64_t ldy) {
  if (M == 0 || N == 0) return;
  if (M <= kRowsAsAMaxRows) {
    panel_gemm_rows_as_a(kernels, x, M, K, N, dequantize_row, y, ldy);
    return;
  }
  const int64_t panels = (N + kPanelRows - 1) / kPanelRows;
  ThreadPool::instance().parallel_for(panels, 1, [&](int64_t p0, int64_t p1) {
    // Scratch the kernels overwrite whole: no zeroing.
    std::unique_ptr<float[]> panel(new float[kPanelRows * K]),
        rows(new float[kTransposeRows * K]);
    AlignedFloats scratch(gemm_workspace(kPanelRows));
    for (int64_t panel_index = p0; panel_index < p1; ++panel_index) {
      const int64_t n0 = panel_index * kPanelRows, count = std::min(kPanelRows, N - n0);
      // B is K x count, row-major: the GEMM's packing then reads contiguous
      // runs, not a column a row apart.
      for (int64_t r0 = 0; r0 < count; r0 += kTransposeRows) {
        const int64_t r1 = std::min(count, r0 + kTransposeRows);
        for (int64_t r = r0; r < r1; ++r) dequantize_row(n0 + r, rows.get() + (r - r0) * K);
        transpose(rows.get(), r1 - r0, K, K, panel.get() + r0, count);
      }
      // y[:, n0:n0+count] = x (M x K) @ panel (K x count).
      GemmProblem problem{x, K, 1, panel.get(), count, 1, y + n0, ldy, M, count, K, nullptr};
      kernels.sgemm(problem, 0, M, 0, count, scratch.get(), nullptr);
    }
  });
}

}  // namespace mlxprog
