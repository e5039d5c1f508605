// A C ABI over the quant tables for the tests (tests/native/quants_lib.py
// builds this file with the tables into a small library, without MLX, and
// loads it with ctypes; on arm64 the same code runs under an emulator).
// Each function returns 0, or -1 for an id or ISA it does not know.
#include <cstring>
#include <vector>

#include "quants.h"

using namespace mlxprog::quants;

namespace {

// The table named `isa` when this library has it, else null.
const QuantKernels* named(const char* isa) {
  const QuantKernels& t = table_for(isa);
  return std::strcmp(t.isa, isa) == 0 ? &t : nullptr;
}

}  // namespace

extern "C" {

// Whether the table `isa` is built into this library (the caller checks the
// CPU runs it).
int mlxprog_quants_has(const char* isa) { return named(isa) ? 1 : 0; }

int mlxprog_quants_dequantize(const char* isa, int type, const uint8_t* src, float* dst,
                              int64_t n) {
  const QuantKernels* t = named(isa);
  TypeKernels k;
  if (!t || !resolve(*t, type, k)) return -1;
  k.dequantize_row(src, dst, n);
  return 0;
}

int mlxprog_quants_quantize(const char* isa, int activation, const float* x, void* dst,
                            int64_t n) {
  const QuantKernels* t = named(isa);
  if (!t || activation < 0 || activation >= kActivations) return -1;
  resolve_quantizer(*t, static_cast<Activation>(activation))(x, dst, n);
  return 0;
}

// The dot product of a row of n weights with x already quantized into the
// type's activation blocks.
int mlxprog_quants_vec_dot(const char* isa, int type, int64_t n, const uint8_t* w,
                           const void* xq, float* out) {
  const QuantKernels* t = named(isa);
  TypeKernels k;
  if (!t || !resolve(*t, type, k)) return -1;
  *out = k.vec_dot(n, w, xq);
  return 0;
}

// The four-row dot product: w holds four rows of n weights (row r at
// w + r * w_bytes / 4), out four floats. Returns 1 without computing when
// the table has no vec_dot_4 for the type (its matmuls go row by row).
int mlxprog_quants_vec_dot_4(const char* isa, int type, int64_t n, const uint8_t* w,
                             int64_t w_bytes, const void* xq, float* out) {
  const QuantKernels* t = named(isa);
  TypeKernels k;
  if (!t || !resolve(*t, type, k) || w_bytes % 4) return -1;
  if (!k.vec_dot_4) return 1;
  k.vec_dot_4(n, w, w_bytes / 4, xq, out);
  return 0;
}

int mlxprog_quants_dot_f32(const char* isa, int64_t n, const float* a, const float* b,
                           float* out) {
  const QuantKernels* t = named(isa);
  if (!t) return -1;
  *out = resolve_dot_f32(*t)(n, a, b);
  return 0;
}

// The int8 GEMM of a type's weight rows (w: whole rows of K elements,
// w_bytes in all) with rows of x already quantized into the type's
// activation blocks (xq_bytes in all): out[i * rows_w + j] = w row j . x
// row i, each weight row unpacked by the table's unpack_row first.
int mlxprog_quants_int8_gemm(const char* isa, int type, int64_t K, const uint8_t* w,
                             int64_t w_bytes, const void* xq, int64_t xq_bytes, float* out) {
  const QuantKernels* t = named(isa);
  TypeKernels k;
  const TypeInfo* info = type_info(type);
  if (!t || !resolve(*t, type, k) || !k.unpack_row || K % info->block) return -1;
  const int64_t row_bytes = K / info->block * info->block_bytes;
  const size_t act_row = activation_row_bytes(*info, K);
  const size_t unpacked_row = int8_row_bytes(*info, K);
  const int64_t rows_w = w_bytes / row_bytes, rows_x = xq_bytes / static_cast<int64_t>(act_row);
  std::vector<uint8_t> unpacked(rows_w * unpacked_row);
  for (int64_t j = 0; j < rows_w; ++j)
    k.unpack_row(w + j * row_bytes, unpacked.data() + j * unpacked_row, K);
  resolve_int8_gemm(*t, info->activation)(K, unpacked.data(), rows_w, k.signed_codes,
                                          static_cast<const uint8_t*>(xq), act_row, rows_x, out,
                                          rows_w);
  return 0;
}

// One row of n elements in the int8 GEMM's form (unpack_row), as the table
// resolves it: out_bytes must be int8_row_bytes of the row.
int mlxprog_quants_unpack(const char* isa, int type, int64_t n, const uint8_t* w, void* out,
                          int64_t out_bytes) {
  const QuantKernels* t = named(isa);
  TypeKernels k;
  const TypeInfo* info = type_info(type);
  if (!t || !resolve(*t, type, k) || !k.unpack_row || n % info->block ||
      static_cast<size_t>(out_bytes) != int8_row_bytes(*info, n))
    return -1;
  k.unpack_row(w, out, n);
  return 0;
}

int mlxprog_quants_set_codebook(const char* name, const void* data, int64_t bytes) {
  return set_codebook(name, data, static_cast<size_t>(bytes)) ? 0 : -1;
}

}  // extern "C"
