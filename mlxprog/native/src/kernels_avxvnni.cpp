// The AVX2 table with AVX-VNNI dot products (x86-64, where the compiler has
// -mavxvnni): the int8 matmul's byte products use vpdpbusd; everything else
// is the AVX2 table's code.
#if defined(__x86_64__) || defined(_M_X64)
#define MLXPROG_ISA_NS kernels_avxvnni
#define MLXPROG_ISA_NAME "avx2+avxvnni"
#define MLXPROG_GEMM_TILE x86::Avx2GemmTile
#define MLXPROG_VNNI_AVX 1  // x86/qmm.h's int8 dot products: vpdpbusd
#include "kernels/x86/table.h"
#endif
