// Exact integer matrix products for mlxprog's native extension: C = A @ B
// modulo 2**bits (two's complement wrap-around, as numpy computes them).
#pragma once

#include <nanobind/nanobind.h>

namespace mlxprog {

// Register `integer_matmul` on the extension's module (called from NB_MODULE).
void bind_int_matmul(nanobind::module_& m);

}  // namespace mlxprog
