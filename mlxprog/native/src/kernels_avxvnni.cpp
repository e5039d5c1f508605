// The AVX2 table with AVX-VNNI dot products (x86-64, where the compiler has
// -mavxvnni): the int8 matmul's byte products use vpdpbusd; everything else
// is the AVX2 table's code.
#if defined(__x86_64__) || defined(_M_X64)
#define MLXPROG_ISA_NS kernels_avxvnni
#define MLXPROG_VNNI_AVX 1  // x86/qmm.h's int8 dot products: vpdpbusd
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
namespace kernels_avxvnni {
namespace {
using x86::Vec;
using Loops = x86::AttentionLoops;
using Tile = x86::Avx2GemmTile;
}  // namespace

extern const Kernels table = {
    "avx2+avxvnni",
    portable::prepare_qmm_x<Vec>, x86::qmm, portable::prepare_qmm_q8<Vec>, x86::qmm_q8,
    x86::swiglu, portable::rms_norm<Vec>, portable::rope<Vec>,
    portable::attention<Loops>, portable::attention_quantized<Loops>, portable::hadamard,
    portable::sgemm<Tile>, portable::pack_b<Tile>, portable::depthwise_conv,
    portable::window_reduce, Tile::MR,
    x86::int_matmul_tiles,
};

}  // namespace kernels_avxvnni
}  // namespace mlxprog
#endif
