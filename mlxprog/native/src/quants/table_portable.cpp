// The portable quant table: plain C++ for every type, always built (the
// reference the vector tables are tested against, and their fallback).
#include <cmath>
#include <cstring>

#include "common.h"
#include "quants.h"

#define MLXPROG_QUANTS_NS portable
#include "portable/activations.h"
#include "portable/legacy.h"
#include "portable/kquants.h"
#include "portable/iquants.h"
#include "portable/int8_gemm.h"

namespace mlxprog {
namespace quants {
namespace portable {

const QuantKernels& table() {
  static const QuantKernels kernels = [] {
    QuantKernels k{};
    k.isa = "portable";
    add_activations(k);
    add_legacy(k);
    add_kquants(k);
    add_iquants(k);
    add_int8_gemm(k);
    return k;
  }();
  return kernels;
}

}  // namespace portable
}  // namespace quants
}  // namespace mlxprog
