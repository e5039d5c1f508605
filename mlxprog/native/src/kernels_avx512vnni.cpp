// The AVX2 table with AVX512-VNNI dot products on 256-bit vectors (x86-64,
// where the compiler has -mavx512vnni): the int8 matmul's byte products use
// vpdpbusd, and the float32 GEMM's micro-kernel 512-bit FMAs (gemm_isa.inc);
// everything else stays at AVX2's vector width.
#if defined(__x86_64__) || defined(_M_X64)
#define MLXPROG_ISA_NS avx512vnni
#define MLXPROG_ISA_NAME "avx2+avx512vnni"
#define MLXPROG_VNNI_AVX512 1
#include "kernels_isa.inc"
#endif
