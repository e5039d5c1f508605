// portable: the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_XS,
// 256-element super-blocks dotted with q8_K activations; plain C++, the
// reference of the vector tables (kquant_blocks.h has the block layouts).
#include "iq4_xs.h"
#include "q2_k.h"
#include "q3_k.h"
#include "q4_k.h"
#include "q5_k.h"
#include "q6_k.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {

// Registers the group's row dequantizers and q8_K dot products.
inline void add_kquants(QuantKernels& k) {
  k.types[static_cast<int>(Type::Q2_K)] = {dequantize_row_q2_k, vec_dot_q2_k,
                                             int8_unpack_row_q2_k, false};
  k.types[static_cast<int>(Type::Q3_K)] = {dequantize_row_q3_k, vec_dot_q3_k,
                                             int8_unpack_row_q3_k, false};
  k.types[static_cast<int>(Type::Q4_K)] = {dequantize_row_q4_k, vec_dot_q4_k,
                                             int8_unpack_row_q4_k, false};
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
