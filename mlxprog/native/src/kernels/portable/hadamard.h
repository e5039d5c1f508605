// portable: the Walsh-Hadamard transform of a quantized cache's groups (see
// Kernels::hadamard); every table runs this one, so every table's bits are
// the ops' MLX form's.
#pragma once

#include "kernels.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace portable {

void hadamard(float* x, int64_t n, int64_t group) {
  for (int64_t g0 = 0; g0 < n; g0 += group)
    for (int64_t h = 1; h < group; h *= 2)
      for (int64_t i = g0; i < g0 + group; i += 2 * h)
        for (int64_t j = i; j < i + h; ++j) {
          const float a = x[j], b = x[j + h];
          x[j] = a + b;
          x[j + h] = a - b;
        }
}

}  // namespace portable
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
