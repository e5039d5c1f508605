// arm: the activation quantizers (float32 -> q8_0, q8_1, q8_K blocks) and
// the float32 dot product, NEON. q8_0 and q8_1 are ggml-cpu's NEON
// quantizers' numbers (scale 1 / (amax / 127), codes rounded half to even:
// on an exact tie a code may differ by one from the portable table's, which
// rounds half away from zero as llama.cpp's reference does); q8_K equals
// the portable table's (llama.cpp's quantize_row_q8_K_ref) bit for bit.
#pragma once

#include "../common.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
// Names live in the nested namespace `activations`: other groups' helpers
// share the enclosing namespace in the same table file.
namespace activations {

// f rounded to the nearest fp16 (ties to even) and back (the base ARMv8
// conversions).
inline float round_fp16_neon(float f) { return static_cast<float>(static_cast<__fp16>(f)); }

// The largest |x[j]| of 32 floats.
inline float max_abs_32(const float* x) {
  float32x4_t m = vabsq_f32(vld1q_f32(x));
  for (int k = 1; k < 8; ++k) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + 4 * k)));
  return vmaxvq_f32(m);
}

// 32 floats times `scale`, rounded half to even, stored as int8 (within
// +-127 by the callers' scales); returns their sum.
inline int32_t store_scaled_codes_32(const float* x, float scale, int8_t* qs) {
  int32x4_t sums = vdupq_n_s32(0);
  for (int k = 0; k < 4; ++k) {
    const int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 8 * k), scale));
    const int32x4_t b = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 8 * k + 4), scale));
    sums = vaddq_s32(sums, vaddq_s32(a, b));
    const int16x8_t halves = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
    vst1_s8(qs + 8 * k, vqmovn_s16(halves));
  }
  return vaddvq_s32(sums);
}

// n floats to q8_0 blocks: d = amax / 127 (kept fp16-rounded), codes
// x * (1 / d) rounded half to even.
void quantize_q8_0(const float* x, void* dst, int64_t n) {
  BlockQ8_0* y = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / 32; ++i, x += 32) {
    const float d = max_abs_32(x) / 127.0f;
    y[i].d = round_fp16_neon(d);
    store_scaled_codes_32(x, d != 0.0f ? 1.0f / d : 0.0f, y[i].qs);
  }
}

// n floats to q8_1 blocks: q8_0's d and codes, and s = d * sum(codes) (d
// before its fp16 rounding, s fp16-rounded).
void quantize_q8_1(const float* x, void* dst, int64_t n) {
  BlockQ8_1* y = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < n / 32; ++i, x += 32) {
    const float d = max_abs_32(x) / 127.0f;
    const int32_t sum = store_scaled_codes_32(x, d != 0.0f ? 1.0f / d : 0.0f, y[i].qs);
    y[i].d = round_fp16_neon(d);
    y[i].s = round_fp16_neon(static_cast<float>(sum) * d);
  }
}

// n floats to q8_K blocks of 256, as the portable quantize_q8_K: scale =
// -127 / peak (peak the first value of largest magnitude), codes
// nearest(scale * x) (half to even; never beyond +-127), d = 1 / scale, and
// the sums of each 16 codes.
void quantize_q8_K(const float* x, void* dst, int64_t n) {
  BlockQ8_K* y = static_cast<BlockQ8_K*>(dst);
  for (int64_t i = 0; i < n / 256; ++i, x += 256) {
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int k = 0; k < 64; ++k) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + 4 * k)));
    const float amax = vmaxvq_f32(m);
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    int first = 0;
    while (std::fabs(x[first]) != amax) ++first;
    const float scale = -127.0f / x[first];
    for (int g = 0; g < 8; ++g) store_scaled_codes_32(x + 32 * g, scale, y[i].qs + 32 * g);
    for (int g = 0; g < 16; ++g)
      y[i].bsums[g] = static_cast<int16_t>(vaddlvq_s8(vld1q_s8(y[i].qs + 16 * g)));
    y[i].d = 1.0f / scale;
  }
}

// sum_i a[i] * b[i]: four vectors of four partial sums (FMA), then the
// remainder one by one.
float dot_f32(int64_t n, const float* a, const float* b) {
  float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 4; ++k)
      acc[k] = vfmaq_f32(acc[k], vld1q_f32(a + i + 4 * k), vld1q_f32(b + i + 4 * k));
  for (; i + 4 <= n; i += 4) acc[0] = vfmaq_f32(acc[0], vld1q_f32(a + i), vld1q_f32(b + i));
  float sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
  for (; i < n; ++i) sum += a[i] * b[i];
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
