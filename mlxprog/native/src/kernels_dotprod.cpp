// The arm64 table for CPUs with the dot-product extension (armv8.2-a
// +dotprod): the quantized matmuls are arm/qmm.h's with sdot; the rest is
// the portable code, as in arm64's portable table.
#if defined(__aarch64__)
#define MLXPROG_ISA_NS kernels_dotprod
#include "kernels/arm/qmm.h"
#include "kernels/portable/attention.h"
#include "kernels/portable/gemm.h"
#include "kernels/portable/hadamard.h"
#include "kernels/portable/int_matmul.h"
#include "kernels/portable/norms.h"
#include "kernels/portable/qmm.h"
#include "kernels/portable/rope.h"
#include "kernels/portable/window.h"

namespace mlxprog {
namespace kernels_dotprod {
namespace {
using portable::Vec;
using Loops = portable::AttentionLoops;
using Tile = portable::GemmTile;
}  // namespace

extern const Kernels table = {
    "neon+dotprod",
    portable::prepare_qmm_x<Vec>, arm::qmm, portable::prepare_qmm_q8<Vec>, arm::qmm_q8,
    portable::swiglu, portable::rms_norm<Vec>, portable::rope<Vec>,
    portable::attention<Loops>, portable::attention_quantized<Loops>, portable::hadamard,
    portable::sgemm<Tile>, portable::pack_b<Tile>, portable::depthwise_conv,
    portable::window_reduce, Tile::MR,
    portable::int_matmul_tiles,
};

}  // namespace kernels_dotprod
}  // namespace mlxprog
#endif
