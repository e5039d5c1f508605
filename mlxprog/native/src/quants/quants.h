// GGML's block-quantized types (GGUF weights) kept in their own blocks: the
// kernels that read them, one table per instruction set.
//
// Layout (as ggml-cpu lays out its arch/ folders): every type has one header
// per ISA holding its row dequantizer and its dot product with 8-bit
// activation blocks:
//   portable/<type>.h  plain C++, always built, the reference every other
//                      table is tested against;
//   x86/<type>.h       AVX2 (with AVX-VNNI or AVX512-VNNI dot products where
//                      the including table is compiled with them);
//   arm/<type>.h       NEON with the dot-product extension.
// A table file (table_<isa>.cpp) includes its ISA's headers inside its own
// namespace and fills one QuantKernels; a type a table lacks resolves to the
// portable table's kernel (resolve()), never to a wrong result. Adding a
// type is its headers plus one line per table, one in table.cpp's kTypes and
// one in mlxprog/ggml/types.py (tests/ops/test_ggml.py keeps the two equal).
//
// Everything here is free of MLX types: primitives/ggml_matmul.cpp makes the kernels
// MLX primitives, and shim.cpp exposes them to the tests through a C ABI.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mlxprog {
namespace quants {

// GGUF's ids of the types these kernels read (mlxprog/ggml/types.py has the
// same table; tests/native/test_quants.py checks they agree).
enum class Type : int {
  Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21,
  IQ2_S = 22, IQ4_XS = 23, IQ1_M = 29, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};
constexpr int kTypeSlots = 40;  // type ids index the tables

// The 8-bit activation blocks of the int8 numerics (llama.cpp's choice per
// type: q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4, q8_1 for Q4_1/Q5_1, q8_K for
// the K-quants and the IQ types). x ~= d * qs. The scales are float32 here
// but hold the values llama.cpp stores (fp16-rounded for q8_0 and q8_1), so
// the dot products are llama.cpp's.
enum class Activation : int { q8_0 = 0, q8_1 = 1, q8_K = 2 };
constexpr int kActivations = 3;

struct BlockQ8_0 {
  float d;
  int8_t qs[32];
};
struct BlockQ8_1 {
  float d;
  float s;  // d * sum(qs), fp16-rounded
  int8_t qs[32];
};
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];  // sums of each 16 consecutive qs
};

// A type's layout: `block` elements stored in `block_bytes` bytes, and the
// activation blocks its dot products read.
struct TypeInfo {
  Type type;
  const char* name;
  int block;
  int block_bytes;
  Activation activation;
};

// The types above, once (null for an id none of them has).
const TypeInfo* type_info(int id);

// The elements and bytes of one activation block.
int activation_block(Activation a);
size_t activation_block_bytes(Activation a);

// The int8 GEMM's form of weight blocks (a prefill's product of many rows
// of x): each block's codes decoded once into a byte each, so the GEMM's
// inner loop is integer multiply-adds only, for every row of x.
//
// For q8_K activations: a 256-element block as 16 groups of 16, value j of
// group g = d * scales[g] * codes[j] + dm * mins[g]; the mins term is
// dotted with the q8_K block's bsums. codes are 0..127 (unsigned types) or
// any int8 (signed_codes types); scales and mins are the type's integers.
struct Int8BlockK {
  int8_t codes[256];
  int16_t scales[16];
  int16_t mins[16];
  float d, dm;
};
// For q8_0 and q8_1 activations: a 32-element block, value j = d *
// codes[j] + m, m nonzero only for the types dotted with q8_1 blocks (whose
// s = d_x * sum(q_x) gives the m term); codes as above.
struct Int8Block32 {
  int8_t codes[32];
  float d, m;
};

// The bytes of one row of K elements of type `info` in the int8 GEMM's form.
size_t int8_row_bytes(const TypeInfo& info, int64_t K);
// The bytes of one row of K activations in the type's activation blocks.
size_t activation_row_bytes(const TypeInfo& info, int64_t K);

// One type's kernels on one ISA.
struct TypeKernels {
  // One row of n elements (a whole number of blocks) to float32, exactly as
  // gguf's numpy dequantizer computes it (bit for bit).
  void (*dequantize_row)(const uint8_t* src, float* dst, int64_t n);
  // sum_i w[i] * x[i] over a row of n elements: w the row's blocks, x the
  // same n values quantized into the type's activation blocks.
  float (*vec_dot)(int64_t n, const uint8_t* w, const void* x);
  // One row of n elements to n / 256 Int8BlockK (q8_K types) or n / 32
  // Int8Block32 at dst, for the int8 GEMM. Every type's portable table has
  // one; null in a vector table that takes the portable one (resolve()).
  void (*unpack_row)(const uint8_t* src, void* dst, int64_t n) = nullptr;
  // Whether unpack_row's codes are signed (see Int8BlockK).
  bool signed_codes = false;
  // vec_dot of four consecutive rows (row r at w + r * row_bytes) with the
  // same activation row: out[r] equals vec_dot of that row bit for bit, the
  // activation blocks read once for the four. Null where a table lacks it
  // (vec_dot row by row).
  void (*vec_dot_4)(int64_t n, const uint8_t* w, int64_t row_bytes, const void* x,
                    float* out) = nullptr;
};

// The int8 GEMM's signature (QuantKernels::int8_gemm).
using Int8Gemm = void (*)(int64_t K, const void* w, int64_t rows_w, bool signed_codes,
                          const uint8_t* x, size_t act_row, int64_t rows_x, float* y, int64_t ldy);

struct QuantKernels {
  const char* isa;
  TypeKernels types[kTypeSlots];
  // x (n floats, a whole number of activation blocks) -> n / block blocks.
  void (*quantize_activation[kActivations])(const float* x, void* dst, int64_t n);
  // sum_i a[i] * b[i] in float32 (the exact numerics' products).
  float (*dot_f32)(int64_t n, const float* a, const float* b);
  // The int8 GEMM of unpacked weight rows with rows of activation blocks of
  // kind a: y[i * ldy + j] = w row j . x row i for j < rows_w, i < rows_x;
  // w is rows_w rows of K elements as unpack_row writes them (Int8BlockK
  // for q8_K, Int8Block32 otherwise), x rows_x rows of act_row bytes. Null
  // in a table without one (arm64's): resolve_int8_gemm gives the portable
  // table's.
  Int8Gemm int8_gemm[kActivations];
};

// The table of that ISA name ("portable", "avx2", "avx2+avxvnni",
// "avx2+avx512vnni", "neon+dotprod": the names of the kernel tables in
// kernels.h) if this binary has it, else the portable one. The caller has
// checked that the CPU runs it.
const QuantKernels& table_for(const char* isa);
const QuantKernels& portable_table();

// Type `id`'s kernels in `table`, each missing one taken from the portable
// table; null when the id is not a type above.
const TypeKernels* resolve(const QuantKernels& table, int id, TypeKernels& out);

// The table's activation quantizer and int8 GEMM of kind `a`, and its float
// dot product: each the portable table's where `table` lacks it.
using Quantizer = void (*)(const float* x, void* dst, int64_t n);
using DotF32 = float (*)(int64_t n, const float* a, const float* b);
Quantizer resolve_quantizer(const QuantKernels& table, Activation a);
Int8Gemm resolve_int8_gemm(const QuantKernels& table, Activation a);
DotF32 resolve_dot_f32(const QuantKernels& table);

// The IQ types' codebooks, taken from the gguf package at run time
// (mlxprog/ggml) rather than written into this code. set_codebook copies
// `bytes` bytes under `name` (portable/iquants.h lists the names and
// sizes); false for an unknown name or a wrong size. codebook returns the
// bytes (null until set): one load, as the kernels ask it once per row.
// Kernels of a type whose codebook is missing are not called: the Python
// side sets every codebook before the first kernel of such a type runs.
enum class Codebook : int { iq2xxs, iq2xs, iq2s, iq3xxs, iq3s, iq1s };
constexpr int kCodebooks = 6;
bool set_codebook(const char* name, const void* data, size_t bytes);
const void* codebook(Codebook book);

}  // namespace quants
}  // namespace mlxprog
