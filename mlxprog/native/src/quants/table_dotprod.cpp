// The arm64 quant table "neon+dotprod": the arm/ headers, compiled with
// -march=armv8.2-a+dotprod (CMakeLists.txt).
#if defined(__aarch64__)
#include <arm_neon.h>

#include <cmath>
#include <cstring>

#include "common.h"
#include "quants.h"

#define MLXPROG_QUANTS_NS dotprod
#include "arm/activations.h"
#include "arm/legacy.h"
#include "arm/kquants.h"
#include "arm/iquants.h"

namespace mlxprog {
namespace quants {
namespace dotprod {

const QuantKernels& table() {
  static const QuantKernels kernels = [] {
    QuantKernels k{};
    k.isa = "neon+dotprod";
    add_activations(k);
    add_legacy(k);
    add_kquants(k);
    add_iquants(k);
    return k;
  }();
  return kernels;
}

}  // namespace dotprod
}  // namespace quants
}  // namespace mlxprog
#endif
