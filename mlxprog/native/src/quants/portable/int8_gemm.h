// portable: the int8 GEMM over weight rows unpacked once (Int8BlockK,
// Int8Block32; each type's unpack_row writes them) and rows of activation
// blocks: plain C++, the reference of the vector tables' GEMMs. Each
// product is the type's dot product regrouped: per block, integer dots of
// codes with q8 codes weighted by the integer group scales, then one float
// multiply-add with the block scales.
#pragma once

#include "../common.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace int8_gemm {

// sum_j codes[j] * q8[j] over `count` elements.
inline int32_t byte_dot(const int8_t* codes, const int8_t* q8, int count) {
  int32_t sum = 0;
  for (int j = 0; j < count; ++j) sum += static_cast<int32_t>(codes[j]) * q8[j];
  return sum;
}

// One unpacked 256-element row (blocks of them) . one q8_K row.
inline float row_dot_k(const Int8BlockK* w, const BlockQ8_K* x, int64_t blocks) {
  float sum = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) {
    int32_t dot = 0, min_dot = 0;
    for (int g = 0; g < 16; ++g) {
      dot += w[b].scales[g] * byte_dot(w[b].codes + 16 * g, x[b].qs + 16 * g, 16);
      min_dot += w[b].mins[g] * x[b].bsums[g];
    }
    sum += x[b].d * (w[b].d * static_cast<float>(dot) + w[b].dm * static_cast<float>(min_dot));
  }
  return sum;
}

// One unpacked 32-element row . one q8_0 row (m is zero for these types).
inline float row_dot_q8_0(const Int8Block32* w, const BlockQ8_0* x, int64_t blocks) {
  float sum = 0.0f;
  for (int64_t b = 0; b < blocks; ++b)
    sum += static_cast<float>(byte_dot(w[b].codes, x[b].qs, 32)) * (w[b].d * x[b].d);
  return sum;
}

// One unpacked 32-element row . one q8_1 row: the m term takes the block's s.
inline float row_dot_q8_1(const Int8Block32* w, const BlockQ8_1* x, int64_t blocks) {
  float sum = 0.0f;
  for (int64_t b = 0; b < blocks; ++b)
    sum += static_cast<float>(byte_dot(w[b].codes, x[b].qs, 32)) * (w[b].d * x[b].d) +
           w[b].m * x[b].s;
  return sum;
}

// The GEMM for activation blocks Act, whose row dot is `dot`.
template <class Weight, class Act, float (*dot)(const Weight*, const Act*, int64_t)>
void gemm(int64_t K, const void* wv, int64_t rows_w, bool, const uint8_t* x, size_t act_row,
          int64_t rows_x, float* y, int64_t ldy) {
  constexpr int64_t block = sizeof(Weight::codes);
  const Weight* w = static_cast<const Weight*>(wv);
  for (int64_t i = 0; i < rows_x; ++i) {
    const Act* xi = reinterpret_cast<const Act*>(x + i * act_row);
    for (int64_t j = 0; j < rows_w; ++j) y[i * ldy + j] = dot(w + j * (K / block), xi, K / block);
  }
}

}  // namespace int8_gemm
}  // namespace

// Registers the int8 GEMM of each activation kind.
inline void add_int8_gemm(QuantKernels& k) {
  k.int8_gemm[static_cast<int>(Activation::q8_K)] =
      int8_gemm::gemm<Int8BlockK, BlockQ8_K, int8_gemm::row_dot_k>;
  k.int8_gemm[static_cast<int>(Activation::q8_0)] =
      int8_gemm::gemm<Int8Block32, BlockQ8_0, int8_gemm::row_dot_q8_0>;
  k.int8_gemm[static_cast<int>(Activation::q8_1)] =
      int8_gemm::gemm<Int8Block32, BlockQ8_1, int8_gemm::row_dot_q8_1>;
}

}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
