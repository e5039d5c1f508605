// GGML block-quantized matmul and dequantization primitives (quant_matmul.cpp).
#pragma once

#include <nanobind/nanobind.h>

#include "kernels.h"

namespace mlxprog {

// Register ggml_matmul, ggml_dequantize, set_codebook and ggml_type_ids on
// the extension's module; `active` points at the kernel table in use (its
// ISA picks the quant table when a primitive is built).
void bind_quants(nanobind::module_& m, const Kernels* const* active);

}  // namespace mlxprog
