// x86 (AVX2+FMA): the SwiGLU over halves on 8-float vectors (the RMS norm is
// portable/norms.h's over x86::Vec).
#pragma once

#include <immintrin.h>

#include "kernels/x86/vec.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace x86 {

// As portable::swiglu, eight at a time; the sigmoid's exp is
// exp_nonpositive, and the last I % 8 go as there.
void swiglu(const SwigluProblem& p, int64_t r0, int64_t r1) {
  const int64_t I = p.I;
  for (int64_t r = r0; r < r1; ++r) {
    const float* gate = p.gate + r * p.stride;
    const float* up = p.up + r * p.stride;
    float* out = p.out + r * I;
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
    for (; i + 8 <= I; i += 8) {
      const __m256 g = _mm256_loadu_ps(gate + i);
      const __m256 e = exp_nonpositive(_mm256_or_ps(g, sign));  // exp(-|g|)
      const __m256 inv = _mm256_div_ps(one, _mm256_add_ps(one, e));
      const __m256 s = _mm256_blendv_ps(inv, _mm256_mul_ps(e, inv),
                                        _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ));
      _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, s), _mm256_loadu_ps(up + i)));
    }
    for (; i < I; ++i) {
      const float g = gate[i], e = __builtin_expf(-__builtin_fabsf(g));
      const float s = g < 0.f ? e / (1.f + e) : 1.f / (1.f + e);
      out[i] = g * s * up[i];
    }
  }
}

}  // namespace x86
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
