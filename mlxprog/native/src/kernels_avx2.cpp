// The AVX2+FMA kernel table (x86-64 only), compiled with -mavx2 -mfma -mf16c:
// the x86 code of every family that has some, the portable code (compiled
// with these flags) of the others.
#if defined(__x86_64__) || defined(_M_X64)
#define MLXPROG_ISA_NS kernels_avx2
#define MLXPROG_ISA_NAME "avx2"
#define MLXPROG_GEMM_TILE x86::Avx2GemmTile
#include "kernels/x86/table.h"
#endif
