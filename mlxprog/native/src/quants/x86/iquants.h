// x86: the IQ types with 8- and 4-wide grids (IQ1_S, IQ1_M, IQ2_XXS,
// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) in AVX2: per 32 weights their grid rows
// gathered into one vector, their sign bits spread to bytes and moved onto
// the q8 codes, one byte multiply-add and one int16 multiply-add with the
// scales; the block's integer sum is the portable kernel's. The int8
// unpackers store the same decoded codes. The ternary types TQ1_0 and
// TQ2_0 have their dot products and unpackers here too (tq1_0.h, tq2_0.h);
// the row dequantizers are the portable ones (resolve()).
#include "iq_simd.h"
#include "iq1_m.h"
#include "iq1_s.h"
#include "iq2_s.h"
#include "iq2_xs.h"
#include "iq2_xxs.h"
#include "iq3_s.h"
#include "iq3_xxs.h"
#include "tq1_0.h"
#include "tq2_0.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {

// A type's table entry from its kernels (iq_x86::GridKernels or
// TernaryKernels): the dot product and the unpacker of signed codes (its
// row dequantizer resolves to the portable one).
template <class Kernels>
TypeKernels vector_type() {
  return {nullptr, Kernels::vec_dot, Kernels::unpack_row, true};
}

// Registers the group's q8_K dot products and int8 unpackers (the row
// dequantizers resolve to the portable ones).
inline void add_iquants(QuantKernels& k) {
  k.types[static_cast<int>(Type::IQ1_S)] = vector_type<Iq1SKernels>();
  k.types[static_cast<int>(Type::IQ1_M)] = vector_type<Iq1MKernels>();
  k.types[static_cast<int>(Type::IQ2_XXS)] = vector_type<Iq2XxsKernels>();
  k.types[static_cast<int>(Type::IQ2_XS)] = vector_type<Iq2XsKernels>();
  k.types[static_cast<int>(Type::IQ2_S)] = vector_type<Iq2SKernels>();
  k.types[static_cast<int>(Type::IQ3_XXS)] = vector_type<Iq3XxsKernels>();
  k.types[static_cast<int>(Type::IQ3_S)] = vector_type<Iq3SKernels>();
  k.types[static_cast<int>(Type::TQ1_0)] = vector_type<Tq1Kernels>();
  k.types[static_cast<int>(Type::TQ2_0)] = vector_type<Tq2Kernels>();
}

}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
