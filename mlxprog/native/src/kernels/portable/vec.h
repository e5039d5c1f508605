// portable: the scalar helpers every family's code shares (element loads and
// stores in any DType, integer min and max) and the portable Vec: the row
// load and dot product that family code takes as its `Vec` template
// parameter, so one algorithm runs on each table's (x86/vec.h has AVX2's).
//
// Every kernel header puts its code in the namespace of the table that
// includes it (MLXPROG_ISA_NS, see kernels.h), in an anonymous namespace and
// then one named after its folder (portable, x86, arm): each table compiles
// its own copy with its own flags, and no inline body is shared between
// tables. The member functions of the types family code is templated on
// (Vec, AttentionLoops, GemmTile) are defined outside their classes, so not
// implicitly inline: inlined more eagerly, a scalar loop is contracted and
// vectorized differently (arm64's dot product gave other bits).
#pragma once

#include <cstring>

#include "kernels.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace portable {

float load_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::f16:
      return half_to_float(static_cast<const uint16_t*>(p)[i]);
    default:
      return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
}

void store_float(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::f16:
      static_cast<uint16_t*>(p)[i] = float_to_half(v);
      break;
    default:
      static_cast<uint16_t*>(p)[i] = float_to_bf16(v);
  }
}

int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

struct Vec {
  // n elements of p (in `t`) from `offset` as float32 into dst.
  static void load_row(const void* p, DType t, int64_t offset, int64_t n, float* dst);

  // a . b over n floats, summed in eight independent lanes (which the
  // compiler vectorizes) and then the rest one by one.
  static float dot(const float* a, const float* b, int64_t n);
};

void Vec::load_row(const void* p, DType t, int64_t offset, int64_t n, float* dst) {
  if (t == DType::f32) {
    std::memcpy(dst, static_cast<const float*>(p) + offset, n * sizeof(float));
    return;
  }
  const uint16_t* src = static_cast<const uint16_t*>(p) + offset;
  for (int64_t i = 0; i < n; ++i)
    dst[i] = t == DType::f16 ? half_to_float(src[i]) : bf16_to_float(src[i]);
}

float Vec::dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float total = 0.f;
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lanes[l] += a[i + l] * b[i + l];
  for (float l : lanes) total += l;
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

}  // namespace portable
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
