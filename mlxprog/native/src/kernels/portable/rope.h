// portable: the rotary embedding (RopeProblem), over the table's Vec; every
// table runs this one.
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "kernels/portable/vec.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace portable {

template <class Vec>
void rope(const RopeProblem& p, int64_t r0, int64_t r1) {
  const int64_t D = p.D, half = p.dims / 2, T = p.T;
  // The rows go head by head over the tokens (r = (b H + h) T + t): every
  // head of a token turns by the same angles, so the chunk computes each
  // token's cosines and sines once (angles[t]: half cosines, half sines),
  // not once per head.
  std::vector<float> row(D);
  // Filled token by token (`computed`), so left uninitialized.
  std::unique_ptr<float[]> angles(new float[T * 2 * half]);
  std::vector<uint8_t> computed(T);
  int64_t angles_of = -1;  // the batch row `angles` holds
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t t = r % T, b = r / (T * p.H);
    if (b != angles_of && p.n_offsets != 1) std::fill(computed.begin(), computed.end(), 0);
    angles_of = b;
    float* cosines = angles.get() + t * 2 * half;
    float* sines = cosines + half;
    if (!computed[t]) {
      const float position = static_cast<float>(p.offsets[p.n_offsets == 1 ? 0 : b] + t);
      for (int64_t i = 0; i < half; ++i) {
        const float theta = position * p.inv_freqs[i];
        cosines[i] = __builtin_cosf(theta);
        sines[i] = __builtin_sinf(theta);
      }
      computed[t] = 1;
    }
    Vec::load_row(p.x, p.dtype, r * D, D, row.data());
    for (int64_t i = 0; i < half; ++i) {
      const int64_t a = p.traditional ? 2 * i : i, c = p.traditional ? 2 * i + 1 : i + half;
      const float x1 = row[a], x2 = row[c];
      store_float(p.out, p.dtype, r * D + a, x1 * cosines[i] - x2 * sines[i]);
      store_float(p.out, p.dtype, r * D + c, x1 * sines[i] + x2 * cosines[i]);
    }
    for (int64_t i = p.dims; i < D; ++i) store_float(p.out, p.dtype, r * D + i, row[i]);
  }
}

}  // namespace portable
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
