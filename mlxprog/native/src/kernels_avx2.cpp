// The AVX2+FMA kernel table (x86-64 only), compiled with -mavx2 -mfma -mf16c.
#if defined(__x86_64__) || defined(_M_X64)
#define MLXPROG_ISA_NS avx2
#define MLXPROG_ISA_NAME "avx2"
#include "kernels_isa.inc"
#endif
