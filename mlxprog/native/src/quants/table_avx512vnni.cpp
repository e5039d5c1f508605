// The x86-64 quant table "avx2+avx512vnni": the x86/ headers compiled with this
// table's flags (CMakeLists.txt); their dot products use VNNI where
// __AVXVNNI__ or __AVX512VNNI__ is defined, AVX2's multiply-adds otherwise.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "common.h"
#include "quants.h"

#define MLXPROG_QUANTS_NS avx512vnni
#include "x86/simd.h"
#include "x86/activations.h"
#include "x86/legacy.h"
#include "x86/kquants.h"

namespace mlxprog {
namespace quants {
namespace avx512vnni {

const QuantKernels& table() {
  static const QuantKernels kernels = [] {
    QuantKernels k{};
    k.isa = "avx2+avx512vnni";
    add_activations(k);
    add_legacy(k);
    add_kquants(k);
    return k;
  }();
  return kernels;
}

}  // namespace avx512vnni
}  // namespace quants
}  // namespace mlxprog
#endif
