// portable: helpers the IQ and ternary types' kernels share (sign patterns,
// codebook rows, small integer dot products with q8_K codes).
#pragma once

#include "kquant_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

constexpr int kSuperBlock = 256;  // elements of every type in this group

// The 8 sign bits of a 7-bit sign index (IQ2_XXS, IQ2_XS, IQ3_XXS): the
// encoder only stores sign patterns with an even number of minus signs, so
// the eighth bit is the parity of the other seven (llama.cpp's ksigns table).
constexpr uint32_t even_signs(uint32_t index7) {
  uint32_t parity = index7 ^ (index7 >> 4);
  parity ^= parity >> 2;
  parity ^= parity >> 1;
  return index7 | ((parity & 1) << 7);
}

// The 8 sign bits of every 7-bit sign index (even_signs), looked up (the
// vector kernels' form).
struct EvenSignTable {
  uint8_t bits[128];
};
constexpr EvenSignTable make_even_sign_table() {
  EvenSignTable table{};
  for (uint32_t i = 0; i < 128; ++i) table.bits[i] = static_cast<uint8_t>(even_signs(i));
  return table;
}
constexpr EvenSignTable kEvenSigns = make_even_sign_table();

// The 32 sign bits of four 7-bit sign indices packed 7 bits apart in `meta`
// (IQ2_XXS, IQ3_XXS): index l's 8 bits at 8l.
[[gnu::always_inline]] inline uint32_t even_signs_32(uint32_t meta) {
  return kEvenSigns.bits[meta & 127] | kEvenSigns.bits[(meta >> 7) & 127] << 8 |
         kEvenSigns.bits[(meta >> 14) & 127] << 16 |
         static_cast<uint32_t>(kEvenSigns.bits[(meta >> 21) & 127]) << 24;
}

// A codebook set from Python (mlxprog/ggml/codebooks.py) as its bytes.
inline const uint8_t* grid_bytes(Codebook book) {
  return static_cast<const uint8_t*>(codebook(book));
}

// sum_j grid[j] * (+-q[j]) over `width` values, q[j] negated where bit j of
// `signs` is set: one grid row against its q8 codes.
inline int32_t signed_grid_dot(const uint8_t* grid, uint32_t signs, const int8_t* q, int width) {
  int32_t sum = 0;
  for (int j = 0; j < width; ++j) {
    const int32_t sign = 1 - 2 * static_cast<int32_t>((signs >> j) & 1);
    sum += static_cast<int32_t>(grid[j]) * sign * q[j];
  }
  return sum;
}

// Writes `width` values (scale * grid[j]) * +-1, -1 where bit j of `signs`
// is set: gguf's operations, and a multiply rather than a branch on random
// sign bits.
inline void write_signed_grid(float scale, const uint8_t* grid, uint32_t signs, float* y,
                              int width) {
  for (int j = 0; j < width; ++j) {
    const float sign = 1.0f - 2.0f * static_cast<float>((signs >> j) & 1);
    y[j] = scale * static_cast<float>(grid[j]) * sign;
  }
}

// Writes `width` codes grid[j], negated where bit j of `signs` is set: a
// grid row in the int8 GEMM's form (Int8BlockK's signed codes).
inline void write_signed_codes(const uint8_t* grid, uint32_t signs, int8_t* codes, int width) {
  for (int j = 0; j < width; ++j) {
    const int32_t value = grid[j];
    codes[j] = static_cast<int8_t>((signs >> j) & 1 ? -value : value);
  }
}

// Sets an IQ or ternary block's Int8BlockK groups: `subs` odd integer
// scales (8: one per 32, 16: one per 16), d the block's float factor, no
// mins (these types' shifts, where they have any, are in their codes).
inline void set_iq_int8_groups(const int* scales, int subs, float d, Int8BlockK& out) {
  static constexpr int kNoMins[16] = {};
  kquant::set_int8_groups(scales, kNoMins, subs, d, 0.0f, out);
}

// sum_j grid[j] * q[j] over one 8-wide row of the ternary iq1s_grid
// (int8 values -1, 0, 1) and its q8 codes.
inline int32_t ternary_grid_dot(const int8_t* grid, const int8_t* q) {
  int32_t sum = 0;
  for (int j = 0; j < 8; ++j) sum += static_cast<int32_t>(grid[j]) * q[j];
  return sum;
}

// The sum of 8 q8 codes.
inline int32_t code_sum8(const int8_t* q) {
  int32_t sum = 0;
  for (int j = 0; j < 8; ++j) sum += q[j];
  return sum;
}

// Writes the 8 values scale * (grid[j] + delta) of an iq1s_grid row (gguf's
// order: the shift first, exact, then one rounding).
inline void write_shifted_grid(float scale, const int8_t* grid, float delta, float* y) {
  for (int j = 0; j < 8; ++j) y[j] = scale * (static_cast<float>(grid[j]) + delta);
}

// Writes the 8 codes of an iq1s_grid row shifted by -1/8 (`negative`) or
// +1/8, times 8: 8 * grid[j] -+ 1, so the values are the codes times the
// block's scale / 8, exactly (gguf's shift of 0.125 is a power of two).
inline void write_shifted_codes(const int8_t* grid, bool negative, int8_t* codes) {
  for (int j = 0; j < 8; ++j) codes[j] = static_cast<int8_t>(8 * grid[j] + (negative ? -1 : 1));
}

// The little-endian uint32 at p (blocks are byte arrays: no alignment).
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The little-endian uint16 at p.
inline uint32_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// The sum of a q8_K block's 256 codes (from its per-16 sums).
inline int32_t q8k_code_sum(const BlockQ8_K& x) {
  int32_t sum = 0;
  for (int k = 0; k < kSuperBlock / 16; ++k) sum += x.bsums[k];
  return sum;
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
