// portable: what the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// IQ4_NL, MXFP4) share. Each block's 32 codes are dotted with one q8_0 or
// q8_1 activation block; 4-bit codes are stored two to a byte, byte j
// holding element j (low nibble) and element j + 16 (high nibble).
#pragma once

#include "../common.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
// Names live in the nested namespace `block32`: other groups' helpers share
// the enclosing namespace in the same table file.
namespace block32 {

constexpr int kBlock32 = 32;  // elements per block

// Bytes per block of each type.
constexpr int kQ4_0Bytes = 18;
constexpr int kQ4_1Bytes = 20;
constexpr int kQ5_0Bytes = 22;
constexpr int kQ5_1Bytes = 24;
constexpr int kQ8_0Bytes = 34;
constexpr int kIq4nlBytes = 18;
constexpr int kMxfp4Bytes = 17;

// Twice the E2M1 values of MXFP4's 16 codes (bit 3 the sign; llama.cpp's
// kvalues_mxfp4, gguf's MXFP4.kvalues): integers, paired with half scales.
constexpr int8_t kMxfp4DoubledValues[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                            0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e - 128), half the E8M0 scale e, built from its bits (e < 2 gives a
// subnormal float), as gguf's e8m0_to_fp32_half.
inline float e8m0_half_scale(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// p itself, but opaque to the compiler: a product passed through here is
// rounded to float before any later add, where FMA contraction (the default
// of GCC and of clang on arm64) would fuse `d * q + m` into one rounding
// that gguf does not do.
inline float rounded_product(float p) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(p));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(p));
#else
  volatile float opaque = p;
  p = opaque;
#endif
  return p;
}

// The 5-bit codes of a Q5_0/Q5_1 block: 4 low bits from the nibbles at qs,
// the fifth from bit j of the little-endian uint32 at qh.
inline void unpack_5bit_codes(const uint8_t* qh, const uint8_t* qs, int32_t codes[kBlock32]) {
  const uint32_t high = static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
                        static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
  for (int j = 0; j < 16; ++j) {
    codes[j] = (qs[j] & 0x0F) | ((high >> j) & 1) << 4;
    codes[j + 16] = (qs[j] >> 4) | ((high >> (j + 16)) & 1) << 4;
  }
}

// The 4-bit codes of a block (16 bytes at qs) as 32 ints.
inline void unpack_4bit_codes(const uint8_t* qs, int32_t codes[kBlock32]) {
  for (int j = 0; j < 16; ++j) {
    codes[j] = qs[j] & 0x0F;
    codes[j + 16] = qs[j] >> 4;
  }
}

// A block's 4-bit indices (16 bytes at qs) looked up in a 16-entry table of
// int8 values (IQ4_NL's, MXFP4's doubled E2M1 values) as 32 ints.
inline void table_codes(const uint8_t* qs, const int8_t* table, int32_t codes[kBlock32]) {
  unpack_4bit_codes(qs, codes);
  for (int j = 0; j < kBlock32; ++j) codes[j] = table[codes[j]];
}

// sum_j codes[j] * q8[j] over one block.
inline int32_t dot_codes(const int32_t codes[kBlock32], const int8_t* q8) {
  int32_t dot = 0;
  for (int j = 0; j < kBlock32; ++j) dot += codes[j] * q8[j];
  return dot;
}

// One block of the int8 GEMM's form (Int8Block32) from its 32 codes, as
// the type's dot product multiplies them, and its d and m.
inline void write_int8_block(const int32_t codes[kBlock32], float d, float m, Int8Block32& out) {
  for (int j = 0; j < kBlock32; ++j) out.codes[j] = static_cast<int8_t>(codes[j]);
  out.d = d;
  out.m = m;
}

}  // namespace block32
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
