// The portable kernel table: the compiler's baseline instruction set (SSE2 on
// x86-64, NEON on arm64), the portable code of every family; on arm64 the
// quantized matmuls are arm/qmm.h's, NEON being the baseline there.
#define MLXPROG_ISA_NS kernels_portable
#include "kernels/portable/attention.h"
#include "kernels/portable/gemm.h"
#include "kernels/portable/hadamard.h"
#include "kernels/portable/int_matmul.h"
#include "kernels/portable/norms.h"
#include "kernels/portable/qmm.h"
#include "kernels/portable/rope.h"
#include "kernels/portable/window.h"
#if defined(__aarch64__)
#include "kernels/arm/qmm.h"
#endif

namespace mlxprog {
namespace kernels_portable {
namespace {
#if defined(__aarch64__)
namespace qmm_code = arm;
#else
namespace qmm_code = portable;
#endif
using portable::Vec;
using Loops = portable::AttentionLoops;
using Tile = portable::GemmTile;
}  // namespace

extern const Kernels table = {
    "portable",
    portable::prepare_qmm_x<Vec>, qmm_code::qmm, portable::prepare_qmm_q8<Vec>, qmm_code::qmm_q8,
    portable::swiglu, portable::rms_norm<Vec>, portable::rope<Vec>,
    portable::attention<Loops>, portable::attention_quantized<Loops>, portable::hadamard,
    portable::sgemm<Tile>, portable::pack_b<Tile>, portable::depthwise_conv,
    portable::window_reduce, Tile::MR,
    portable::int_matmul_tiles,
};

}  // namespace kernels_portable
}  // namespace mlxprog
