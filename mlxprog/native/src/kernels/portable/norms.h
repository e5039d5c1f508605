// portable: the RMS norm (over the table's Vec) and the SwiGLU over halves,
// in plain C++ (x86/norms.h has an AVX2 SwiGLU).
#pragma once

#include "kernels/portable/vec.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace portable {

// Like MLX's CPU rms_norm: normalise in float32, round to the input dtype,
// then multiply by the weight in that dtype.
template <class Vec>
void rms_norm(const RmsNormProblem& p, int64_t r0, int64_t r1) {
  const int64_t D = p.D;
  float* row = new float[2 * D];
  float* weight = row + D;
  if (p.weight) {
    Vec::load_row(p.weight, p.weight_dtype, 0, D, weight);
  } else {
    for (int64_t i = 0; i < D; ++i) weight[i] = 1.f;
  }
  for (int64_t r = r0; r < r1; ++r) {
    Vec::load_row(p.x, p.dtype, r * D, D, row);
    const float mean_square = Vec::dot(row, row, D) / static_cast<float>(D);
    const float inv = 1.f / __builtin_sqrtf(mean_square + p.eps);
    if (p.dtype == DType::f32) {
      float* out = static_cast<float*>(p.out) + r * D;
      for (int64_t i = 0; i < D; ++i) out[i] = row[i] * inv * weight[i];
      continue;
    }
    for (int64_t i = 0; i < D; ++i) {
      const float v = row[i] * inv;
      const float rounded = p.dtype == DType::f16 ? half_to_float(float_to_half(v))
                                                  : bf16_to_float(float_to_bf16(v));
      store_float(p.out, p.dtype, r * D + i, rounded * weight[i]);
    }
  }
  delete[] row;
}

// silu(g) * u = g * sigmoid(g) * u, with sigmoid(g) from e = exp(-|g|):
// 1 / (1 + e) for g >= 0, e / (1 + e) below (no overflow either way). A NaN
// or infinite g gives what MLX's formula gives (NaN for -inf and NaN).
void swiglu(const SwigluProblem& p, int64_t r0, int64_t r1) {
  const int64_t I = p.I;
  for (int64_t r = r0; r < r1; ++r) {
    const float* gate = p.gate + r * p.stride;
    const float* up = p.up + r * p.stride;
    float* out = p.out + r * I;
    for (int64_t i = 0; i < I; ++i) {
      const float g = gate[i], e = __builtin_expf(-__builtin_fabsf(g));
      const float s = g < 0.f ? e / (1.f + e) : 1.f / (1.f + e);
      out[i] = g * s * up[i];
    }
  }
}

}  // namespace portable
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
