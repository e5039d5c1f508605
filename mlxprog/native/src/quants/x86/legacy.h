// x86: the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL,
// MXFP4) with AVX2 (VNNI dot products where the table has them).
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
  // Four-row dot products for the narrow signed-code blocks, whose decode
  // is bound by instructions rather than memory. Q8_0's wide blocks are
  // bound by memory, and four rows streamed together read slower than one
  // (docs/benchmarks.md); Q4_1/Q5_1 keep their row-at-a-time sums. Every
  // type unpacks for the int8 GEMM with vector stores (the same form as the
  // portable unpackers).
  k.types[static_cast<int>(Type::Q4_0)] = {block32::dequantize_row_q4_0, block32::vec_dot_q4_0,
                                           block32::int8_unpack_row_q4_0, true,
                                           block32::vec_dot_4_q4_0};
  k.types[static_cast<int>(Type::Q4_1)] = {block32::dequantize_row_q4_1, block32::vec_dot_q4_1,
                                           block32::int8_unpack_row_q4_1, false};
  k.types[static_cast<int>(Type::Q5_0)] = {block32::dequantize_row_q5_0, block32::vec_dot_q5_0,
                                           block32::int8_unpack_row_q5_0, true,
                                           block32::vec_dot_4_q5_0};
  k.types[static_cast<int>(Type::Q5_1)] = {block32::dequantize_row_q5_1, block32::vec_dot_q5_1,
                                           block32::int8_unpack_row_q5_1, false};
  k.types[static_cast<int>(Type::Q8_0)] = {block32::dequantize_row_q8_0, block32::vec_dot_q8_0,
                                           block32::int8_unpack_row_q8_0, true};
  k.types[static_cast<int>(Type::IQ4_NL)] = {block32::dequantize_row_iq4_nl,
                                             block32::vec_dot_iq4_nl,
                                             block32::int8_unpack_row_iq4_nl, true,
                                             block32::vec_dot_4_iq4_nl};
  k.types[static_cast<int>(Type::MXFP4)] = {block32::dequantize_row_mxfp4, block32::vec_dot_mxfp4,
                                            block32::int8_unpack_row_mxfp4, true,
                                            block32::vec_dot_4_mxfp4};
}

}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
