// portable: the 32-element block types (llama.cpp's "legacy" quants Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0, and IQ4_NL, MXFP4): row dequantizers and dot
// products with q8_0 / q8_1 activations, plain C++.
#include "block32.h"
#include "iq4_nl.h"
#include "mxfp4.h"
#include "q4_0.h"
#include "q4_1.h"
#include "q5_0.h"
#include "q5_1.h"
#include "q8_0.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {

// Registers the group's row dequantizers and dot products.
inline void add_legacy(QuantKernels& k) {
  k.types[static_cast<int>(Type::Q4_0)] = {block32::dequantize_row_q4_0, block32::vec_dot_q4_0,
                                           block32::int8_unpack_row_q4_0, true};
  k.types[static_cast<int>(Type::Q4_1)] = {block32::dequantize_row_q4_1, block32::vec_dot_q4_1,
                                           block32::int8_unpack_row_q4_1, false};
  k.types[static_cast<int>(Type::Q5_0)] = {block32::dequantize_row_q5_0, block32::vec_dot_q5_0,
                                           block32::int8_unpack_row_q5_0, true};
  k.types[static_cast<int>(Type::Q5_1)] = {block32::dequantize_row_q5_1, block32::vec_dot_q5_1,
                                           block32::int8_unpack_row_q5_1, false};
  k.types[static_cast<int>(Type::Q8_0)] = {block32::dequantize_row_q8_0, block32::vec_dot_q8_0,
                                           block32::int8_unpack_row_q8_0, true};
  k.types[static_cast<int>(Type::IQ4_NL)] = {block32::dequantize_row_iq4_nl,
                                             block32::vec_dot_iq4_nl,
                                             block32::int8_unpack_row_iq4_nl, true};
  k.types[static_cast<int>(Type::MXFP4)] = {block32::dequantize_row_mxfp4, block32::vec_dot_mxfp4,
                                           block32::int8_unpack_row_mxfp4, true};
}

}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
