// The x86-64 quant table "avx2+avxvnni": AVX2 with AVX-VNNI
// dot products; the x86/ headers
// compiled with this table's flags (CMakeLists.txt).
#if defined(__x86_64__) || defined(_M_X64)
#define MLXPROG_QUANTS_NS avxvnni
#define MLXPROG_QUANTS_NAME "avx2+avxvnni"
#include "x86/table.h"
#endif
