// panel_gemm: dequantized panels of weight rows laid out as the float GEMM's
// B, multiplied on the thread pool.
#include "primitives/panel_gemm.h"

#include <algorithm>
#include <cstdint>
#include <memory>

#include "threadpool.h"

namespace mlxprog {
namespace {

// Weight rows one panel holds: a chunk of work for one thread, whose
// dequantized floats (kPanelRows * K) stay in L2 while x passes over them.
constexpr int64_t kPanelRows = 128;
// Weight rows dequantized together and transposed into a panel's columns.
constexpr int64_t kTransposeRows = 8;

}  // namespace

void panel_gemm(const Kernels& kernels, const float* x, int64_t M, int64_t K, int64_t N,
                const RowDequantizer& dequantize_row, float* y, int64_t ldy) {
  if (M == 0 || N == 0) return;
  const int64_t panels = (N + kPanelRows - 1) / kPanelRows;
  ThreadPool::instance().parallel_for(panels, 1, [&](int64_t p0, int64_t p1) {
    // Scratch the kernels overwrite whole: no zeroing.
    std::unique_ptr<float[]> panel(new float[kPanelRows * K]),
        rows(new float[kTransposeRows * K]), work(new float[gemm_workspace(kPanelRows) + 16]);
    // sgemm wants its scratch 64-byte aligned.
    float* scratch = reinterpret_cast<float*>(
        (reinterpret_cast<uintptr_t>(work.get()) + 63) & ~uintptr_t{63});
    for (int64_t panel_index = p0; panel_index < p1; ++panel_index) {
      const int64_t n0 = panel_index * kPanelRows, count = std::min(kPanelRows, N - n0);
      // B is K x count, row-major: the GEMM's packing then reads contiguous
      // runs, not a column a row apart.
      for (int64_t r0 = 0; r0 < count; r0 += kTransposeRows) {
        const int64_t r1 = std::min(count, r0 + kTransposeRows);
        for (int64_t r = r0; r < r1; ++r) dequantize_row(n0 + r, rows.get() + (r - r0) * K);
        for (int64_t kk = 0; kk < K; ++kk)
          for (int64_t r = r0; r < r1; ++r) panel[kk * count + r] = rows[(r - r0) * K + kk];
      }
      // y[:, n0:n0+count] = x (M x K) @ panel (K x count).
      GemmProblem problem{x, K, 1, panel.get(), count, 1, y + n0, ldy, M, count, K, nullptr};
      kernels.sgemm(problem, 0, M, 0, count, scratch, nullptr);
    }
  });
}

}  // namespace mlxprog
