// The portable kernel table: the compiler's baseline instruction set.
#define MLXPROG_ISA_NS portable
#define MLXPROG_ISA_NAME "portable"
#include "kernels_isa.inc"
