// The RMS norm that a transformer layer runs too: run_rms_norm.
#pragma once

#include <cstdint>

#include "primitive.h"

namespace mlxprog {

// rows x D: out = rms_norm(x) * weight.
void run_rms_norm(const float* x, const void* weight, DType weight_dtype, int64_t rows,
                  int64_t D, float eps, float* out);

}  // namespace mlxprog
