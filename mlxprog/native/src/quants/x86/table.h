// The x86-64 quant table, written once for the three that differ only in
// their flags (table_avx2.cpp, table_avxvnni.cpp, table_avx512vnni.cpp):
// the including file defines MLXPROG_QUANTS_NS (this copy's namespace) and
// MLXPROG_QUANTS_NAME (the table's name), then includes this header once;
// the x86/ headers use VNNI where __AVXVNNI__ or __AVX512VNNI__ is defined,
// AVX2's multiply-adds otherwise.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../common.h"
#include "../quants.h"
#include "simd.h"
#include "activations.h"
#include "legacy.h"
#include "kquants.h"
#include "iquants.h"
#include "int8_gemm.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {

const QuantKernels& table() {
  static const QuantKernels kernels = [] {
    QuantKernels k{};
    k.isa = MLXPROG_QUANTS_NAME;
    add_activations(k);
    add_legacy(k);
    add_kquants(k);
    add_iquants(k);
    add_int8_gemm(k);
    return k;
  }();
  return kernels;
}

}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
