// Kernels of mlxprog's native CPU primitives, free of MLX types: the problem
// each kernel solves and the table of them (Kernels) that a primitive calls.
//
// One table per instruction set, laid out as ggml-cpu lays out its arch
// folders. kernels/portable/<family>.h holds a family's plain C++ code,
// kernels/x86/<family>.h its AVX2 code (with AVX-VNNI or AVX512-VNNI dot
// products in the int8 matmul where the table is compiled with them) and
// kernels/arm/<family>.h its NEON code (with sdot where compiled for it).
// A table file, kernels_<table>.cpp, defines MLXPROG_ISA_NS (its namespace,
// into which every header it includes puts its own copy of the code) and is
// compiled with its ISA's flags; it names each family's version it runs:
//   kernels_portable.cpp    the compiler's baseline (SSE2 on x86-64, NEON on
//                           arm64, whose quantized matmuls are arm/'s);
//   kernels_avx2.cpp        AVX2+FMA (x86-64);
//   kernels_avxvnni.cpp     the AVX2 table with AVX-VNNI dot products;
//   kernels_avx512vnni.cpp  the AVX2 table with AVX512-VNNI dot products and
//                           a 512-bit GEMM tile;
//   kernels_dotprod.cpp     NEON with the dot-product extension (arm64).
// A family an ISA has no code of runs the portable code, compiled with that
// table's flags. Where an algorithm is shared and only its inner loops are
// not (the RMS norm, attention, the GEMM's blocking), the portable header
// writes it as a template over the loops (a `Vec`, `Loops` or `Tile` type)
// and the table names the ISA's: portable::rms_norm<x86::Vec>.
// select_kernels() picks a table at run time from the CPU's features.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mlxprog {

enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };

// A quantized matmul in MLX's affine format: out = x @ dequantize(w).T
// (transpose) or x @ dequantize(w). Weights are a little-endian bit stream of
// `bits`-wide codes; value = scale * code + bias per group of `group_size`.
struct QmmProblem {
  const float* x;     // prepared activations: M rows of K (see prepare_qmm_x)
  const float* xsum;  // M x (K / group_size) group sums of x (transpose only)
  const uint8_t* w;   // packed codes, row-major
  const void* scales; // one per group, row-major, `sb_dtype`
  const void* biases;
  DType scales_dtype;
  DType biases_dtype;
  float* out;         // M x N, float32
  int64_t M, N, K;
  int bits, group_size;
  bool transpose;
  // int8 numerics (qmm_q8, transpose only): x quantized per group by
  // prepare_qmm_q8: M x K codes, and per group its scale d and d * sum(q).
  const int8_t* xq;
  const float* xd;
  const float* xqsum;
};

// RMS norm over the last axis: out = x * rsqrt(mean(x^2) + eps) * weight.
struct RmsNormProblem {
  const void* x;       // rows x D, `dtype`
  const void* weight;  // D, `weight_dtype`, or null (all ones)
  void* out;           // rows x D, `dtype`
  DType dtype, weight_dtype;
  int64_t D;
  float eps;
};

// Rotary embedding of x [B, H, T, D] (rows are (b, h, t) triples), rotating
// the first `dims` features of each row at position offset[b] + t.
struct RopeProblem {
  const void* x;
  void* out;
  DType dtype;
  const int32_t* offsets;  // one per batch row (broadcast when n_offsets == 1)
  int64_t n_offsets;
  const float* inv_freqs;  // dims / 2 inverse frequencies (already / scale)
  int64_t B, H, T, D;
  int dims;
  bool traditional;        // rotate (2i, 2i+1) pairs, else (i, i + dims/2)
};

// Attention of T new queries over a KV cache in [B, H_kv, S, D] layout,
// queries [B, H, T, D] (H a multiple of H_kv: grouped-query heads). Query t
// of batch b sees key j when j <= start + t, j > start + t - window (when
// window > 0) and key_mask[b, j] (when given); a query that sees no key gets
// zeros. Scores are q . k * scale, capped at softcap * tanh(score / softcap)
// when softcap > 0. With sinks, head h's logit sinks[h] joins each of its
// queries' softmax as one more (uncapped) score whose value is zero: it
// takes probability mass and adds nothing (gpt-oss's attention sinks).
// float32 throughout.
//
// A quantized cache (format.kv_bits 4 or 8) holds its keys and values as
// MLX's affine quantization along D (see QuantizedRows) in k_quantized and
// v_quantized instead of k and v; the quantized kernel takes work items
// (batch, KV head, query position), so that every query head of a group
// reads one dequantized copy of each key and value. With format.hadamard
// the cache holds the quantization of each group's Walsh-Hadamard transform
// (see Kernels::hadamard): the kernel transforms the queries to match and
// its results back (H H = group_size I, so q . k = (H q / group_size) .
// (H k)).
//
// A cache's format, as Python's cache kind (mlxprog/cache_kinds.py) gives
// it (its native_format): float32 keys and values (kv_bits 0), or MLX's
// affine quantization of them (kv_bits 4 or 8, groups of kv_group_size
// features), with hadamard of each group's Walsh-Hadamard transform.
struct CacheFormat {
  int kv_bits = 0;
  int kv_group_size = 0;
  bool hadamard = false;

  bool quantized() const { return kv_bits != 0; }
  // The arrays a cache is: k and v, or the codes, scales and biases of each.
  size_t arrays() const { return quantized() ? 6 : 2; }
  // Whether array i holds packed codes (uint32; the others are float32).
  bool codes(size_t i) const { return quantized() && i % 3 == 0; }
  bool operator==(const CacheFormat& o) const {
    return kv_bits == o.kv_bits && kv_group_size == o.kv_group_size && hadamard == o.hadamard;
  }
};

struct QuantizedRows {
  const uint8_t* codes;  // D * bits / 8 bytes a row: codes packed little-endian
  const float* scales;   // D / group_size a row: value = scale * code + bias
  const float* biases;
};

// A quantized cache's recent ring, its last tokens in float (KIVI's
// full-precision residual): a query at slot pos reads each key and value of
// the last R slots up to pos (j > pos - R) in float, not dequantized: its own
// new row where j >= start, else the ring's entry j % R while that entry
// still holds slot j (slots[b, j % R] == j; -1 or any other slot: the cache's
// row). Rows are in the cache's basis (with format.hadamard, each group's
// transform), as the rows that the cache quantizes. R = 0: no ring.
struct RecentRows {
  int64_t R;
  const float* k_recent;  // [B, H_kv, R, D]
  const float* v_recent;
  const int32_t* slots;   // [B, R]: the slot each entry holds
  const float* new_k;     // [B, H_kv, T, D]: this step's keys and values
  const float* new_v;
};

// Consecutive query positions of one head that the float attention kernel
// takes together (without a sliding window): each block of keys and value
// rows it reads serves all of them. run_attention hands the kernel chunks of
// this many query rows.
constexpr int64_t kAttentionQueryBlock = 16;

struct AttentionProblem {
  const float* q;
  const float* k;
  const float* v;
  const uint8_t* key_mask;  // B x S booleans, or null
  float* out;               // [B, H, T, D]
  int64_t B, H, H_kv, T, S, D;
  int64_t start;            // the clamped cache offset of query 0
  float scale;
  int64_t window;           // sliding window in keys; 0: every key up to the query's
  float softcap;            // 0: scores uncapped
  const float* sinks;       // H sink logits, one a query head, or null
  CacheFormat format;       // float: k and v; quantized: k_quantized, v_quantized
  QuantizedRows k_quantized, v_quantized;
  RecentRows recent;        // quantized caches only
};

// SwiGLU of float32 rows: out[r, i] = silu(gate[r * stride + i]) *
// up[r * stride + i]. The two halves of a fused gate/up projection's rows
// (up = gate + I, stride 2I), or two arrays (stride I).
struct SwigluProblem {
  const float* gate;
  const float* up;
  float* out;  // rows x I
  int64_t I, stride;
};

// The input of a convolution, for a GEMM whose A is its patch matrix
// (implicit im2col): row m of A is output pixel m (batch, o0, o1, o2), column
// k is tap k / group_channels (k0, k1, k2 row-major over `kernel`) and channel
// k % group_channels; an element whose input position falls in the padding is
// zero. x is dense [batch, in0, in1, in2, channels] (fewer spatial dimensions
// as size 1); GemmProblem::a points at the group's first channel.
struct ConvGeometry {
  int64_t channels;        // x's last dimension
  int64_t group_channels;  // channels one group reads
  int64_t in[3], out[3], kernel[3], stride[3], pad[3], dilation[3];  // pad: the low side
};

// What is applied to each finished output value, while it is still in
// registers or L1: the column's bias (a convolution's per-channel bias; null:
// none) and the residual's element (laid out as C, with C's row stride; a
// residual block's shortcut), then the activation. Fused there, a
// convolution's bias add, shortcut add and ReLU cost no extra pass over its
// result.
enum class Activation : int { none = 0, relu = 1 };
struct Epilogue {
  const float* bias = nullptr;      // N values, one per column of C
  const float* residual = nullptr;  // M x N values at C's offsets
  Activation activation = Activation::none;
  bool empty() const {
    return bias == nullptr && residual == nullptr && activation == Activation::none;
  }
};

// C (M x N, row stride c_rs, dense rows) = epilogue(A (M x K) @ B (K x N)),
// float32. A and B are read through element strides (row, column), so
// transposed and broadcast views need no copy; with `conv` set A is gathered
// as above.
struct GemmProblem {
  const float* a;
  int64_t a_rs, a_cs;
  const float* b;
  int64_t b_rs, b_cs;
  float* c;
  int64_t c_rs;
  int64_t M, N, K;
  const ConvGeometry* conv;
  Epilogue epilogue{};
};

// The GEMM's cache blocks: a KC-deep slice of an MC-row block of A is packed
// (MC x KC floats, for the 512 KiB L2) against a KC x NC slice of B (for the
// L3); every table's register tile divides MC and NC.
constexpr int64_t kGemmKC = 256, kGemmMC = 144, kGemmNC = 4064;

// The floats of scratch one sgemm call over `cols` output columns needs.
inline int64_t gemm_workspace(int64_t cols) {
  const int64_t nc = cols < kGemmNC ? cols : kGemmNC;
  // nc + 32: its last panel padded; + 16: room to align to 64 bytes.
  return kGemmMC * kGemmKC + kGemmKC * (nc + 32) + 16;
}

// The columns of B packed whole (a multiple of every table's register tile).
inline int64_t gemm_packed_cols(int64_t N) { return (N + 31) / 32 * 32; }

// A depthwise convolution (one input channel per group, one output channel
// per input channel): out [batch, out0, out1, out2, C] from x [batch, in0,
// in1, in2, C] (dense) and taps [kernel volume, C] (the weight transposed so
// a tap's channels are adjacent); geometry as ConvGeometry (group_channels 1).
struct DepthwiseProblem {
  const float* x;
  const float* taps;
  float* out;
  ConvGeometry g;
  int64_t batch;
  Epilogue epilogue{};  // bias: one value per channel
};

// A window reduction (XLA's reduce_window) of a dense float32 x whose axes
// are `rank` outer axes followed by `inner` elements that every window takes
// whole (trailing axes the window leaves alone, merged): out[o, :] reduces
// x[o * stride - pad + w * dilation, :] (per outer axis) over the window
// positions w that fall inside x; positions in the padding add the
// reduction's identity (0, 1, -inf, +inf), i.e. nothing. Rows, for the
// threads, run over the outer output axes but the last; out is dense.
enum class WindowOp : int { sum = 0, product = 1, max = 2, min = 3 };
struct WindowProblem {
  const float* x;
  float* out;
  WindowOp op;
  int rank;
  const int64_t* in;         // x's outer axes
  const int64_t* out_shape;  // out's outer axes
  const int64_t* window;
  const int64_t* stride;
  const int64_t* dilation;
  const int64_t* pad;      // the low side
  const int64_t* in_step;  // x's element stride per outer axis
  int64_t inner;
};

// The exact integer matmul's micro-kernel for lanes of type Lane (its
// blocking driver: primitives/int_matmul_driver.h): c[i * ldc + j] += sum
// over k < kc of a[k * mr + i] * b[k * nr + j], for an mr x nr tile of lanes
// (a, b: packed micro-panels), wrapping as unsigned arithmetic does.
template <class Lane>
struct IntTile {
  int64_t mr, nr;
  void (*micro)(int64_t kc, const Lane* a, const Lane* b, Lane* c, int64_t ldc);
};

// One tile per lane width: 8- and 16-bit dtypes are computed in uint16
// lanes, 32-bit ones in uint32, 64-bit ones in uint64.
struct IntMatmulTiles {
  IntTile<uint16_t> u16;
  IntTile<uint32_t> u32;
  IntTile<uint64_t> u64;
};

struct Kernels {
  const char* isa;
  // Convert x (M x K, `dtype`) to float32 in the order the qmm kernel reads
  // it, and (transpose) its group sums.
  void (*prepare_qmm_x)(const void* x, DType dtype, int64_t M, int64_t K, int bits,
                        int group_size, bool transpose, float* xp, float* xsum);
  // Output columns [n0, n1) of a quantized matmul, every row.
  void (*qmm)(const QmmProblem& p, int64_t n0, int64_t n1);
  // int8 numerics, 4- and 8-bit codes, transpose (see kernels/portable/qmm.h):
  // quantize x (M x K, `dtype`) per group to int8 in the order qmm_q8 reads
  // codes, leaving xhat = d * q in `xp` (M x K floats, the same order; qmm_q8
  // reads it as p.x), then output columns [n0, n1).
  void (*prepare_qmm_q8)(const void* x, DType dtype, int64_t M, int64_t K, int bits,
                         int group_size, float* xp, int8_t* xq, float* xd, float* xqsum);
  void (*qmm_q8)(const QmmProblem& p, int64_t n0, int64_t n1);
  // Rows [r0, r1) of a SwiGLU over halves.
  void (*swiglu)(const SwigluProblem& p, int64_t r0, int64_t r1);
  // Rows [r0, r1) of an RMS norm.
  void (*rms_norm)(const RmsNormProblem& p, int64_t r0, int64_t r1);
  // Rows [r0, r1) of a rotary embedding (row = (b * H + h) * T + t).
  void (*rope)(const RopeProblem& p, int64_t r0, int64_t r1);
  // Query rows [i0, i1) of an attention, a row being a (batch, head, query
  // position) triple in q's order (consecutive positions of a head taken
  // together, up to kAttentionQueryBlock).
  void (*attention)(const AttentionProblem& p, int64_t i0, int64_t i1);
  // Items [i0, i1) of an attention over a quantized cache, an item being a
  // (batch, KV head, query position) triple: the query heads of that group.
  void (*attention_quantized)(const AttentionProblem& p, int64_t i0, int64_t i1);
  // The unnormalized Walsh-Hadamard transform (Sylvester's order: butterflies
  // of distance 1, 2, 4, ...) of each group of `group` floats (a power of
  // two) of x, n floats, in place. Adds and subtracts only, in a fixed
  // order: every table, and the ops' MLX form, give the same bits.
  void (*hadamard)(float* x, int64_t n, int64_t group);
  // The block rows [m0, m1) x columns [n0, n1) of a float32 GEMM, with
  // `work` scratch of gemm_workspace(n1 - n0) floats. `packed_b`: B already
  // packed by sgemm_pack_b (then n0 is a multiple of 32), or null.
  void (*sgemm)(const GemmProblem& p, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                float* work, const float* packed_b);
  // Pack B's rows [k0, k0 + kc) x columns [n0, n0 + nc) (k0 a multiple of
  // kGemmKC, kc the rest of that slice up to kGemmKC, n0 a multiple of 32)
  // for sgemm: the whole B takes K * gemm_packed_cols(N) floats, and this
  // part goes at k0 * gemm_packed_cols(N) + n0 * kc.
  void (*sgemm_pack_b)(const GemmProblem& p, int64_t k0, int64_t kc, int64_t n0, int64_t nc,
                       float* dst);
  // Output rows [r0, r1) of a depthwise convolution, a row being a
  // (batch, o0, o1) triple: its out2 x C outputs.
  void (*depthwise_conv)(const DepthwiseProblem& p, int64_t r0, int64_t r1);
  // Output rows [r0, r1) of a window reduction.
  void (*window_reduce)(const WindowProblem& p, int64_t r0, int64_t r1);
  // The rows of sgemm's register tile: row blocks split best on its multiples.
  int sgemm_rows;
  // The exact integer matmul's micro-kernels.
  IntMatmulTiles int_matmul;
};

const Kernels& portable_kernels();
// The table of that name ("portable", "avx2", "avx2+avxvnni",
// "avx2+avx512vnni", "neon+dotprod") if it is built and the CPU runs it,
// else null.
const Kernels* kernels_named(const char* name);

// The table to use: the one MLXPROG_NATIVE_ISA names, where usable (e.g.
// "portable" forces the portable one); otherwise the best the CPU supports.
const Kernels& select_kernels();

// Scalar conversions shared by every table.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
inline float bf16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f);

}  // namespace mlxprog
