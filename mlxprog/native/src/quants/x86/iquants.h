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

// A grid type's table entry: GridKernels' dot product and unpacker (its
// row dequantizer resolves to the portable one).
template <class Grid>
TypeKernels grid_type() {
  return {nullptr, Grid::vec_dot, Grid::unpack_row, true};
}

// Registers the group's q8_K dot products and int8 unpackers (the row
// dequantizers resolve to the portable ones).
inline void add_iquants(QuantKernels& k) {
  k.types[static_cast<int>(Type::IQ1_S)] = grid_type<Iq1SKernels>();
  k.types[static_cast<int>(Type::IQ1_M)] = grid_type<Iq1MKernels>();
  k.types[static_cast<int>(Type::IQ2_XXS)] = grid_type<Iq2XxsKernels>();
  k.types[static_cast<int>(Type::IQ2_XS)] = grid_type<Iq2XsKernels>();
  k.types[static_cast<int>(Type::IQ2_S)] = grid_type<Iq2SKernels>();
  k.types[static_cast<int>(Type::IQ3_XXS)] = grid_type<Iq3XxsKernels>();
  k.types[static_cast<int>(Type::IQ3_S)] = grid_type<Iq3SKernels>();
  // The ternary types (their row dequantizers are the portable ones).
  k.types[static_cast<int>(Type::TQ1_0)] = {nullptr, tq1_x86::vec_dot_tq1_0,
                                            tq1_x86::int8_unpack_row_tq1_0, true};
  k.types[static_cast<int>(Type::TQ2_0)] = {nullptr, tq2_x86::vec_dot_tq2_0,
                                            tq2_x86::int8_unpack_row_tq2_0, true};
}

}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
