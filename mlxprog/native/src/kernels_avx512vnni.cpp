// The AVX2 table with AVX512-VNNI dot products on 256-bit vectors (x86-64,
// where the compiler has -mavx512vnni): the int8 matmul's byte products use
// vpdpbusd, and the float32 GEMM's tile 512-bit FMAs (x86/gemm_avx512.h);
// everything else stays at AVX2's vector width.
#if defined(__x86_64__) || defined(_M_X64)
#define MLXPROG_ISA_NS kernels_avx512vnni
#define MLXPROG_VNNI_AVX512 1  // x86/qmm.h's int8 dot products: vpdpbusd
#include "kernels/portable/attention.h"
#include "kernels/portable/gemm.h"
#include "kernels/portable/hadamard.h"
#include "kernels/portable/norms.h"
#include "kernels/portable/qmm.h"
#include "kernels/portable/rope.h"
#include "kernels/portable/window.h"
#include "kernels/x86/attention.h"
#include "kernels/x86/gemm.h"
#include "kernels/x86/gemm_avx512.h"
#include "kernels/x86/int_matmul.h"
#include "kernels/x86/norms.h"
#include "kernels/x86/qmm.h"
#include "kernels/x86/vec.h"

namespace mlxprog {
namespace kernels_avx512vnni {
namespace {
using x86::Vec;
using Loops = x86::AttentionLoops;
using Tile = x86::Avx512GemmTile;
}  // namespace

extern const Kernels table = {
    "avx2+avx512vnni",
    portable::prepare_qmm_x<Vec>, x86::qmm, portable::prepare_qmm_q8<Vec>, x86::qmm_q8,
    x86::swiglu, portable::rms_norm<Vec>, portable::rope<Vec>,
    portable::attention<Loops>, portable::attention_quantized<Loops>, portable::hadamard,
    portable::sgemm<Tile>, portable::pack_b<Tile>, portable::depthwise_conv,
    portable::window_reduce, Tile::MR,
    x86::int_matmul_tiles,
};

}  // namespace kernels_avx512vnni
}  // namespace mlxprog
#endif
