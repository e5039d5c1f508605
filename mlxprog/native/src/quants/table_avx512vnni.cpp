// The x86-64 quant table "avx2+avx512vnni": AVX2 with AVX512-VNNI
// dot products on 256-bit vectors; the x86/ headers
// compiled with this table's flags (CMakeLists.txt).
#if defined(__x86_64__) || defined(_M_X64)
#define MLXPROG_QUANTS_NS avx512vnni
#define MLXPROG_QUANTS_NAME "avx2+avx512vnni"
#include "x86/table.h"
#endif
