// arm: the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_XS in NEON with
// the dot-product extension (kquant_neon.h has the scheme), 256-element
// super-blocks dotted with q8_K activations.
#include "kquant_neon.h"
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
  k.types[static_cast<int>(Type::Q2_K)] = {dequantize_row_q2_k, vec_dot_q2_k};
  k.types[static_cast<int>(Type::Q3_K)] = {dequantize_row_q3_k, vec_dot_q3_k};
  k.types[static_cast<int>(Type::Q4_K)] = {dequantize_row_q4_k, vec_dot_q4_k};
  k.types[static_cast<int>(Type::Q5_K)] = {dequantize_row_q5_k, vec_dot_q5_k};
  k.types[static_cast<int>(Type::Q6_K)] = {dequantize_row_q6_k, vec_dot_q6_k};
  k.types[static_cast<int>(Type::IQ4_XS)] = {dequantize_row_iq4_xs, vec_dot_iq4_xs};
}

}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
