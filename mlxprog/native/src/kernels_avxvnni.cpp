// The AVX2 table with AVX-VNNI dot products (x86-64, where the compiler has
// -mavxvnni): the int8 matmul's byte products use vpdpbusd.
#if defined(__x86_64__) || defined(_M_X64)
#define MLXPROG_ISA_NS avxvnni
#define MLXPROG_ISA_NAME "avx2+avxvnni"
#define MLXPROG_VNNI_AVX 1
#include "kernels_isa.inc"
#endif
