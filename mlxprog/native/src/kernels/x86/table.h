// The x86-64 kernel table, written once for the tables that differ only in
// their flags and two choices (kernels_avx2.cpp, kernels_avxvnni.cpp,
// kernels_avx512vnni.cpp): the including file defines MLXPROG_ISA_NS (this
// copy's namespace), MLXPROG_ISA_NAME (the table's name) and
// MLXPROG_GEMM_TILE (the float GEMM's register tile; a tile of another
// header is included first), and any VNNI macro x86/qmm.h reads, then
// includes this header once.
#include "kernels/portable/attention.h"
#include "kernels/portable/gemm.h"
#include "kernels/portable/hadamard.h"
#include "kernels/portable/norms.h"
#include "kernels/portable/qmm.h"
#include "kernels/portable/rope.h"
#include "kernels/portable/window.h"
#include "kernels/x86/attention.h"
#include "kernels/x86/gemm.h"
#include "kernels/x86/int_matmul.h"
#include "kernels/x86/norms.h"
#include "kernels/x86/qmm.h"
#include "kernels/x86/vec.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
using x86::Vec;
using Loops = x86::AttentionLoops;
using Tile = MLXPROG_GEMM_TILE;
}  // namespace

extern const Kernels table = {
    MLXPROG_ISA_NAME,
    portable::prepare_qmm_x<Vec>, x86::qmm, portable::prepare_qmm_q8<Vec>, x86::qmm_q8,
    x86::swiglu, portable::rms_norm<Vec>, portable::rope<Vec>,
    portable::attention<Loops>, portable::attention_quantized<Loops>, portable::hadamard,
    portable::sgemm<Tile>, portable::pack_b<Tile>, portable::depthwise_conv,
    portable::window_reduce, Tile::MR,
    x86::int_matmul_tiles,
};

}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
