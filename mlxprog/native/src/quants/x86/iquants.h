// x86: the IQ types with 8- and 4-wide grids (IQ1_S, IQ1_M, IQ2_XXS,
// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) in AVX2: per 32 weights their grid rows
// gathered into one vector, their sign bits spread to bytes and moved onto
// the q8 codes, one byte multiply-add and one int16 multiply-add with the
// scales; the block's integer sum is the portable kernel's. The int8
// unpackers store the same decoded codes. The row dequantizers and the TQ
// types are the portable ones (resolve()).
#include "iq_simd.h"
#include "iq1_m.h"
#include "iq1_s.h"
#include "iq2_s.h"
#include "iq2_xs.h"
#include "iq2_xxs.h"
#include "iq3_s.h"
#include "iq3_xxs.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {

// Registers the group's q8_K dot products and int8 unpackers (the row
// dequantizers resolve to the portable ones).
inline void add_iquants(QuantKernels& k) {
  k.types[static_cast<int>(Type::IQ1_S)] = {nullptr, vec_dot_iq1_s,
                                            int8_unpack_row_iq1_s, true};
  k.types[static_cast<int>(Type::IQ1_M)] = {nullptr, vec_dot_iq1_m,
                                            int8_unpack_row_iq1_m, true};
  k.types[static_cast<int>(Type::IQ2_XXS)] = {nullptr, vec_dot_iq2_xxs,
                                              int8_unpack_row_iq2_xxs, true};
  k.types[static_cast<int>(Type::IQ2_XS)] = {nullptr, vec_dot_iq2_xs,
                                             int8_unpack_row_iq2_xs, true};
  k.types[static_cast<int>(Type::IQ2_S)] = {nullptr, vec_dot_iq2_s,
                                            int8_unpack_row_iq2_s, true};
  k.types[static_cast<int>(Type::IQ3_XXS)] = {nullptr, vec_dot_iq3_xxs,
                                              int8_unpack_row_iq3_xxs, true};
  k.types[static_cast<int>(Type::IQ3_S)] = {nullptr, vec_dot_iq3_s,
                                            int8_unpack_row_iq3_s, true};
}

}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
