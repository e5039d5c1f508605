// The x86-64 quant table "avx2": AVX2 (FMA, F16C); the x86/ headers
// compiled with this table's flags (CMakeLists.txt).
#if defined(__x86_64__) || defined(_M_X64)
#define MLXPROG_QUANTS_NS avx2
#define MLXPROG_QUANTS_NAME "avx2"
#include "x86/table.h"
#endif
