// portable: the IQ types (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
// IQ3_S) and the ternary ones (TQ1_0, TQ2_0): 256-weight super-blocks dotted
// with q8_K activations, plain C++. The x86 and arm64 tables have their
// own dot products and int8 unpackers of the group (x86/iquants.h,
// arm/iquants.h); the row dequantizers resolve to the ones here on every
// table.
//
// The IQ grids are not written here: mlxprog/ggml/codebooks.py builds them
// from the gguf package and sets them (quants::set_codebook) before any
// kernel of these types runs. Names and byte layouts (row r of a grid is the
// `width` bytes at r * width, i.e. llama.cpp's uint64/uint32 grid entries
// read as little-endian bytes):
//   "iq2xxs_grid"  256 x 8 uint8 (values 8, 25, 43)          IQ2_XXS
//   "iq2xs_grid"   512 x 8 uint8 (values 8, 25, 43)          IQ2_XS
//   "iq2s_grid"   1024 x 8 uint8 (values 8, 25, 43)          IQ2_S
//   "iq3xxs_grid"  256 x 4 uint8 (values 4, 12, ..., 52, 62)  IQ3_XXS
//   "iq3s_grid"    512 x 4 uint8 (values 1, 3, ..., 15)      IQ3_S
//   "iq1s_grid"   2048 x 8 int8  (values -1, 0, 1)           IQ1_S, IQ1_M
// The 7-bit sign indices' patterns (llama.cpp's ksigns) follow a rule (the
// eighth sign is the parity of the seven) and are computed (even_signs).
#include "iq_common.h"
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

// Registers the group's row dequantizers, q8_K dot products and int8 GEMM
// unpackers (signed codes).
inline void add_iquants(QuantKernels& k) {
  k.types[static_cast<int>(Type::IQ1_S)] = {dequantize_row_iq1_s, vec_dot_iq1_s,
                                            int8_unpack_row_iq1_s, true};
  k.types[static_cast<int>(Type::IQ1_M)] = {dequantize_row_iq1_m, vec_dot_iq1_m,
                                            int8_unpack_row_iq1_m, true};
  k.types[static_cast<int>(Type::IQ2_XXS)] = {dequantize_row_iq2_xxs, vec_dot_iq2_xxs,
                                              int8_unpack_row_iq2_xxs, true};
  k.types[static_cast<int>(Type::IQ2_XS)] = {dequantize_row_iq2_xs, vec_dot_iq2_xs,
                                             int8_unpack_row_iq2_xs, true};
  k.types[static_cast<int>(Type::IQ2_S)] = {dequantize_row_iq2_s, vec_dot_iq2_s,
                                            int8_unpack_row_iq2_s, true};
  k.types[static_cast<int>(Type::IQ3_XXS)] = {dequantize_row_iq3_xxs, vec_dot_iq3_xxs,
                                              int8_unpack_row_iq3_xxs, true};
  k.types[static_cast<int>(Type::IQ3_S)] = {dequantize_row_iq3_s, vec_dot_iq3_s,
                                            int8_unpack_row_iq3_s, true};
  k.types[static_cast<int>(Type::TQ1_0)] = {Tq1Kernels::dequantize_row, Tq1Kernels::vec_dot,
                                            Tq1Kernels::unpack_row, true};
  k.types[static_cast<int>(Type::TQ2_0)] = {Tq2Kernels::dequantize_row, Tq2Kernels::vec_dot,
                                            Tq2Kernels::unpack_row, true};
}

}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
