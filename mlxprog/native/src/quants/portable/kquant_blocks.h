// The K-quants' and IQ4_XS's block layouts and the decoders of their packed
// scale fields, shared by every ISA's kernels of the group (plain C++; each
// table compiles them into its own namespace). All are 256-element
// super-blocks dotted with q8_K activation blocks.
//
// Names live in the nested namespace `kquant`: other groups' helpers share
// the enclosing namespace in the same table file.
#pragma once

#include "../common.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace kquant {

constexpr int kBlock = 256;

// The blocks as llama.cpp lays them out (byte arrays only: no padding, no
// alignment; fp16 fields read with load_fp16).
struct Q2K {
  uint8_t scales[16];  // per 16: scale (low nibble), min (high nibble)
  uint8_t qs[64];      // 2-bit codes
  uint8_t d[2], dmin[2];
};
struct Q3K {
  uint8_t hmask[32];   // third bit of each code
  uint8_t qs[64];      // low 2 bits
  uint8_t scales[12];  // 16 6-bit scales, offset by 32
  uint8_t d[2];
};
struct Q4K {
  uint8_t d[2], dmin[2];
  uint8_t scales[12];  // 8 6-bit scales and 8 6-bit mins
  uint8_t qs[128];     // 4-bit codes
};
struct Q5K {
  uint8_t d[2], dmin[2];
  uint8_t scales[12];  // as Q4_K
  uint8_t qh[32];      // fifth bit of each code
  uint8_t qs[128];     // low 4 bits
};
struct Q6K {
  uint8_t ql[128];    // low 4 bits
  uint8_t qh[64];     // high 2 bits
  int8_t scales[16];  // per 16
  uint8_t d[2];
};
struct IQ4XS {
  uint8_t d[2];
  uint8_t scales_h[2];  // high 2 bits of the 8 scales (little-endian uint16)
  uint8_t scales_l[4];  // low 4 bits of the 8 scales
  uint8_t qs[128];      // 4-bit indices into kIq4Levels
};
static_assert(sizeof(Q2K) == 84 && sizeof(Q3K) == 110 && sizeof(Q4K) == 144 && sizeof(Q5K) == 176 &&
                  sizeof(Q6K) == 210 && sizeof(IQ4XS) == 136,
              "K-quant block sizes");

// The little-endian uint32 at p.
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Q4_K's and Q5_K's 12 bytes of 6-bit fields unpacked into one byte each,
// as four little-endian words: the scales 0..3, 4..7, then the mins 0..3,
// 4..7. Fields 0..3 are the low six bits of bytes 0..3 (scales) and 4..7
// (mins); fields 4..7 take their low four bits from the nibbles of bytes
// 8..11 and their top two from the top bits of bytes 0..7. The masks keep
// every bit inside its own byte, so byte order does not matter.
inline void q4_k_scale_words(const uint8_t* packed, uint32_t words[4]) {
  const uint32_t a0 = load_u32(packed), a1 = load_u32(packed + 4), a2 = load_u32(packed + 8);
  words[0] = a0 & 0x3F3F3F3Fu;
  words[1] = (a2 & 0x0F0F0F0Fu) | ((a0 >> 2) & 0x30303030u);
  words[2] = a1 & 0x3F3F3F3Fu;
  words[3] = ((a2 >> 4) & 0x0F0F0F0Fu) | ((a1 >> 2) & 0x30303030u);
}

// The same fields as bytes: out[0..8) the scales, out[8..16) the mins.
inline void q4_k_scales_mins(const uint8_t* packed, uint8_t out[16]) {
  uint32_t words[4];
  q4_k_scale_words(packed, words);
  std::memcpy(out, words, 16);
}

// Q3_K's 12 bytes of 6-bit scales unpacked into one byte each (0..63, the
// scale + 32), as four little-endian words of scales 0..3, 4..7, 8..11,
// 12..15. Scale i's low four bits are the low (i < 8) or high nibble of
// byte i % 8; its top two are bits 2 * (i / 4) of byte 8 + i % 4.
inline void q3_k_scale_words(const uint8_t* packed, uint32_t words[4]) {
  const uint32_t a0 = load_u32(packed), a1 = load_u32(packed + 4), a2 = load_u32(packed + 8);
  words[0] = (a0 & 0x0F0F0F0Fu) | ((a2 << 4) & 0x30303030u);
  words[1] = (a1 & 0x0F0F0F0Fu) | ((a2 << 2) & 0x30303030u);
  words[2] = ((a0 >> 4) & 0x0F0F0F0Fu) | (a2 & 0x30303030u);
  words[3] = ((a1 >> 4) & 0x0F0F0F0Fu) | ((a2 >> 2) & 0x30303030u);
}

// Q3_K's 16 scales as int8 (-32..31).
inline void q3_k_scales(const uint8_t* packed, int8_t out[16]) {
  uint32_t words[4];
  q3_k_scale_words(packed, words);
  uint8_t raw[16];
  std::memcpy(raw, words, 16);
  for (int i = 0; i < 16; ++i) out[i] = static_cast<int8_t>(raw[i] - 32);
}

// IQ4_XS's eight 6-bit scales (the stored value - 32): the low four bits of
// scale i are nibble i of scales_l, the top two bits 2i of scales_h.
inline void iq4_xs_scales(const IQ4XS& b, int8_t out[8]) {
  const uint32_t low = load_u32(b.scales_l);
  const uint32_t high = static_cast<uint32_t>(b.scales_h[0]) | static_cast<uint32_t>(b.scales_h[1])
                                                                   << 8;
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<int8_t>((((low >> (4 * i)) & 0x0F) | (((high >> (2 * i)) & 3) << 4)) - 32);
}

// sum_j codes[j] * q8[j] over `count` elements.
inline int32_t code_dot(const int8_t* codes, const int8_t* q8, int count) {
  int32_t sum = 0;
  for (int j = 0; j < count; ++j) sum += static_cast<int32_t>(codes[j]) * q8[j];
  return sum;
}

// The symmetric types (Q3_K, Q6_K, IQ4_XS: a block's `subs` sub-blocks of
// signed codes, each with an integer scale): the block's values, (d *
// scale) * code, as gguf computes them.
inline void write_scaled(float d, const int8_t* scales, int subs, const int8_t* codes,
                         float* y) {
  const int size = kBlock / subs;
  for (int sub = 0; sub < subs; ++sub) {
    const float scale = d * static_cast<float>(scales[sub]);
    for (int j = size * sub; j < size * sub + size; ++j)
      y[j] = scale * static_cast<float>(codes[j]);
  }
}

// The same block's integer dot product with q8 codes: sum over sub-blocks
// of scale * (codes . q8).
inline int32_t scaled_dot(const int8_t* scales, int subs, const int8_t* codes, const int8_t* q8) {
  const int size = kBlock / subs;
  int32_t dot = 0;
  for (int sub = 0; sub < subs; ++sub)
    dot += scales[sub] * code_dot(codes + size * sub, q8 + size * sub, size);
  return dot;
}

// p itself, but opaque to the compiler: a product passed through here is
// rounded to float before the subtraction that follows, which FMA
// contraction (GCC's default wherever FMA exists, clang's on arm64) would
// otherwise fuse into one rounding that gguf's numpy does not do.
inline float rounded_product(float p) {
#if defined(__GNUC__) && defined(__x86_64__)
  __asm__("" : "+x"(p));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(p));
#else
  volatile float opaque = p;
  p = opaque;
#endif
  return p;
}

// Sets the scales and mins of an Int8BlockK from per-group integers: groups
// of 32 (subs 8) give each scale to two groups of 16.
inline void set_int8_groups(const int* scales, const int* mins, int subs, float d, float dm,
                            Int8BlockK& out) {
  for (int g = 0; g < 16; ++g) {
    out.scales[g] = static_cast<int16_t>(scales[g * subs / 16]);
    out.mins[g] = static_cast<int16_t>(mins[g * subs / 16]);
  }
  out.d = d;
  out.dm = dm;
}

// An Int8BlockK's scales and mins from a Q4_K/Q5_K block's packed 6-bit
// fields, d and dm = -dmin (each 32's scale and min for its two groups; d
// and dmin converted by the caller, each table with its own fp16 code).
inline void set_q4_k_int8_groups(const uint8_t* packed, float d, float dmin, Int8BlockK& out) {
  uint8_t scales_mins[16];
  q4_k_scales_mins(packed, scales_mins);
  int scales[8], mins[8];
  for (int s = 0; s < 8; ++s) scales[s] = scales_mins[s], mins[s] = scales_mins[8 + s];
  set_int8_groups(scales, mins, 8, d, -dmin, out);
}

// An Int8BlockK's scales and mins from a Q6_K block: each 16's scale, its
// min -32 * scale, d and dm = d (the codes stored as q + 32; d converted by
// the caller).
inline void set_q6_k_int8_groups(const Q6K& block, float d, Int8BlockK& out) {
  int scales[16], mins[16];
  for (int g = 0; g < 16; ++g) scales[g] = block.scales[g], mins[g] = -32 * scales[g];
  set_int8_groups(scales, mins, 16, d, d, out);
}

}  // namespace kquant
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
