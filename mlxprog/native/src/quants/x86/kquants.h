// x86: the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_XS in AVX2 (VNNI's
// int16 dot products where the table has them), 256-element super-blocks
// dotted with q8_K activations: each block's codes are unpacked into 256-bit
// vectors, multiplied with the q8 codes in int16 pairs, weighted by the
// sub-block scales into int32 lanes, and one float multiply-add per block
// accumulates across blocks (one horizontal sum per row).
#include "kquant_simd.h"
#include "iq4_xs.h"
#include "q2_k.h"
#include "q3_k.h"
#include "q4_k.h"
#include "q5_k.h"
#include "q6_k.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {

// Registers the group's row dequantizers, q8_K dot products and int8
// unpackers (Q2_K's, Q3_K's and Q4_K's are the portable ones: Q4_K's plain
// nibble loop, which the compiler vectorizes, measured as fast as a
// vector one).
inline void add_kquants(QuantKernels& k) {
  k.types[static_cast<int>(Type::Q2_K)] = {dequantize_row_q2_k, vec_dot_q2_k};
  k.types[static_cast<int>(Type::Q3_K)] = {dequantize_row_q3_k, vec_dot_q3_k};
  k.types[static_cast<int>(Type::Q4_K)] = {dequantize_row_q4_k, vec_dot_q4_k};
  k.types[static_cast<int>(Type::Q5_K)] = {dequantize_row_q5_k, vec_dot_q5_k,
                                             int8_unpack_row_q5_k, false};
  k.types[static_cast<int>(Type::Q6_K)] = {dequantize_row_q6_k, vec_dot_q6_k,
                                             int8_unpack_row_q6_k, false};
  k.types[static_cast<int>(Type::IQ4_XS)] = {dequantize_row_iq4_xs, vec_dot_iq4_xs,
                                               int8_unpack_row_iq4_xs, true};
}

}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
