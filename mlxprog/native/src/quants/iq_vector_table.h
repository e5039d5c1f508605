// The IQ grid and ternary types' entries in a vector table, written once
// for every ISA: x86/iquants.h and arm/iquants.h include this after their
// type headers, which define each type's kernels (Iq1SKernels, ...,
// Tq2Kernels: the ISA's GridKernels or TernaryKernels) in the table's
// namespace.
#pragma once

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {

// A type's entry from its kernels: the dot product and the unpacker of
// signed codes; the row dequantizer resolves to the portable one.
template <class Kernels>
TypeKernels vector_type() {
  return {nullptr, Kernels::vec_dot, Kernels::unpack_row, true};
}

// Registers the group's q8_K dot products and int8 unpackers.
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
