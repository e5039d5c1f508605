// The extension module, _mlxprog_native: each primitive family adds its
// functions (primitive.h's bind_*).
#include <nanobind/nanobind.h>

#include "primitive.h"

NB_MODULE(_mlxprog_native, m) {
  m.doc() = "mlxprog's native CPU kernels as MLX primitives";
  mlxprog::bind_quantized_matmul(m);
  mlxprog::bind_norms(m);
  mlxprog::bind_rope(m);
  mlxprog::bind_attention(m);
  mlxprog::bind_transformer_layer(m);
  mlxprog::bind_gemm_conv(m);
  mlxprog::bind_window(m);
  mlxprog::bind_runtime(m);
  mlxprog::bind_int_matmul(m);
  mlxprog::bind_ggml(m);
  mlxprog::bind_moe_route(m);
}
