// portable: the rotary embedding (RopeProblem), over the table's Vec; every
// table runs this one.
#pragma once

#include "kernels/portable/vec.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace portable {

template <class Vec>
void rope(const RopeProblem& p, int64_t r0, int64_t r1) {
  const int64_t D = p.D, half = p.dims / 2;
  float* row = new float[D + 2 * half];
  float* cosines = row + D;
  float* sines = cosines + half;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t t = r % p.T, b = r / (p.T * p.H);
    const int64_t offset = p.offsets[p.n_offsets == 1 ? 0 : b];
    const float position = static_cast<float>(offset + t);
    for (int64_t i = 0; i < half; ++i) {
      const float theta = position * p.inv_freqs[i];
      cosines[i] = __builtin_cosf(theta);
      sines[i] = __builtin_sinf(theta);
    }
    Vec::load_row(p.x, p.dtype, r * D, D, row);
    for (int64_t i = 0; i < half; ++i) {
      const int64_t a = p.traditional ? 2 * i : i, c = p.traditional ? 2 * i + 1 : i + half;
      const float x1 = row[a], x2 = row[c];
      store_float(p.out, p.dtype, r * D + a, x1 * cosines[i] - x2 * sines[i]);
      store_float(p.out, p.dtype, r * D + c, x1 * sines[i] + x2 * cosines[i]);
    }
    for (int64_t i = p.dims; i < D; ++i) store_float(p.out, p.dtype, r * D + i, row[i]);
  }
  delete[] row;
}

}  // namespace portable
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
