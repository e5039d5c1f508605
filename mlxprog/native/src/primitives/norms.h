// The RMS norm and the SwiGLU that a transformer layer runs too: run_rms_norm,
// run_swiglu.
#pragma once

#include <cstdint>

#include "primitive.h"

namespace mlxprog {

// rows x D: out = rms_norm(x) * weight.
void run_rms_norm(const float* x, const void* weight, DType weight_dtype, int64_t rows,
                  int64_t D, float eps, float* out);

// rows x I: out = silu(gate) * up, row r's values at gate + r * stride and
// up + r * stride; on the pool.
void run_swiglu(const float* gate, const float* up, int64_t stride, int64_t I, float* out,
                int64_t rows);

}  // namespace mlxprog
