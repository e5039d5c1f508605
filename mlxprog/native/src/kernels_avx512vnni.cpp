// The AVX2 table with AVX512-VNNI dot products on 256-bit vectors (x86-64,
// where the compiler has -mavx512vnni): the int8 matmul's byte products use
// vpdpbusd, and the float32 GEMM's tile 512-bit FMAs (x86/gemm_avx512.h);
// everything else stays at AVX2's vector width.
#if defined(__x86_64__) || defined(_M_X64)
#define MLXPROG_ISA_NS kernels_avx512vnni
#define MLXPROG_ISA_NAME "avx2+avx512vnni"
#define MLXPROG_GEMM_TILE x86::Avx512GemmTile
#define MLXPROG_VNNI_AVX512 1  // x86/qmm.h's int8 dot products: vpdpbusd
#include "kernels/x86/gemm_avx512.h"
#include "kernels/x86/table.h"
#endif
