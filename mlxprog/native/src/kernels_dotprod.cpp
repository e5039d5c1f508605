// The arm64 table for CPUs with the dot-product extension (armv8.2-a
// +dotprod): the int8 matmul uses sdot; the rest is the NEON code.
#if defined(__aarch64__)
#define MLXPROG_ISA_NS dotprod
#define MLXPROG_ISA_NAME "neon+dotprod"
#include "kernels_isa.inc"
#endif
