// portable: the activation quantizers (float32 -> q8_0, q8_1, q8_K blocks)
// and the float32 dot product, plain C++. q8_0 and q8_1 follow llama.cpp's
// reference quantizers (quantize_row_q8_0_ref / _q8_1_ref: scale
// 1 / (amax / 127), codes rounded half away from zero), so q8_0 equals
// gguf's Q8_0 quantizer bit for bit; q8_K follows quantize_row_q8_K_ref
// (codes rounded half to even; an all-zero block's bsums are zeroed too,
// where llama.cpp leaves them unset). The vector tables round q8_0 / q8_1
// codes half to even, as ggml-cpu's AVX2 and NEON quantizers do.
#pragma once

#include "../common.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
// Names live in the nested namespace `activations`: other groups' helpers
// share the enclosing namespace in the same table file.
namespace activations {

// The largest |x[j]| of n values.
inline float block_max_abs(const float* x, int n) {
  float amax = 0.0f;
  for (int j = 0; j < n; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  return amax;
}

// n floats to q8_0 blocks: d = amax / 127 (kept fp16-rounded), codes
// round(x / d).
void quantize_q8_0(const float* x, void* dst, int64_t n) {
  BlockQ8_0* y = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / 32; ++i, x += 32) {
    const float d = block_max_abs(x, 32) / 127.0f;
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = round_fp16(d);
    for (int j = 0; j < 32; ++j) y[i].qs[j] = static_cast<int8_t>(std::round(x[j] * inverse));
  }
}

// n floats to q8_1 blocks: q8_0's d and codes, and s = d * sum(codes) (d
// before its fp16 rounding, s fp16-rounded), as llama.cpp stores them.
void quantize_q8_1(const float* x, void* dst, int64_t n) {
  BlockQ8_1* y = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < n / 32; ++i, x += 32) {
    const float d = block_max_abs(x, 32) / 127.0f;
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < 32; ++j) {
      y[i].qs[j] = static_cast<int8_t>(std::round(x[j] * inverse));
      sum += y[i].qs[j];
    }
    y[i].d = round_fp16(d);
    y[i].s = round_fp16(static_cast<float>(sum) * d);
  }
}

// n floats to q8_K blocks of 256: with `peak` the first value of largest
// magnitude, scale = -127 / peak, codes nearest(scale * x) (at most 127),
// d = 1 / scale (a float, not fp16-rounded), and the sums of each 16 codes;
// an all-zero block gets d = 0 and zero codes.
void quantize_q8_K(const float* x, void* dst, int64_t n) {
  BlockQ8_K* y = static_cast<BlockQ8_K*>(dst);
  for (int64_t i = 0; i < n / 256; ++i, x += 256) {
    float peak = 0.0f, amax = 0.0f;
    for (int j = 0; j < 256; ++j)
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        peak = x[j];
      }
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    const float scale = -127.0f / peak;
    for (int j = 0; j < 256; ++j) {
      const int code = static_cast<int>(std::nearbyint(scale * x[j]));
      y[i].qs[j] = static_cast<int8_t>(code < 127 ? code : 127);
    }
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += y[i].qs[16 * g + j];
      y[i].bsums[g] = static_cast<int16_t>(sum);
    }
    y[i].d = 1.0f / scale;
  }
}

// sum_i a[i] * b[i] over eight interleaved partial sums (a vectorizable
// order, and a smaller rounding error than one running sum).
float dot_f32(int64_t n, const float* a, const float* b) {
  float partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) partial[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) partial[0] += a[i] * b[i];
  float sum = 0.0f;
  for (float p : partial) sum += p;
  return sum;
}

}  // namespace activations
}  // namespace

// Registers the activation quantizers and the float32 dot product.
inline void add_activations(QuantKernels& k) {
  k.quantize_activation[static_cast<int>(Activation::q8_0)] = activations::quantize_q8_0;
  k.quantize_activation[static_cast<int>(Activation::q8_1)] = activations::quantize_q8_1;
  k.quantize_activation[static_cast<int>(Activation::q8_K)] = activations::quantize_q8_K;
  k.dot_f32 = activations::dot_f32;
}

}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
