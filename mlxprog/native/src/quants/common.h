// What every quant table shares: the IQ4 levels, and scalar fp16 <-> float
// conversions that need no instruction-set support (the tables' vector code
// has its own).
#pragma once

#include <cstdint>
#include <cstring>

namespace mlxprog {
namespace quants {

// The 16 non-linear levels of IQ4_NL's and IQ4_XS's 4-bit codes (llama.cpp's
// kvalues_iq4nl; gguf's IQ4_NL.kvalues): the formats' definition.
constexpr int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

// IEEE half to float, exactly (subnormals, inf, nan included).
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF, bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000 | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exponent = 113;
    while (!(mantissa & 0x400)) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Float to the nearest half (ties to even), as numpy's astype(float16).
inline uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = (x >> 16) & 0x8000;
  const uint32_t magnitude = x & 0x7FFFFFFF;
  if (magnitude >= 0x7F800000)
    return sign | 0x7C00 | (magnitude > 0x7F800000 ? 0x200 | ((magnitude >> 13) & 0x3FF) : 0);
  if (magnitude >= 0x477FF000) return sign | 0x7C00;
  if (magnitude < 0x38800000) {
    if (magnitude < 0x33000000) return sign;
    const uint32_t shift = 126 - (magnitude >> 23);
    const uint32_t mantissa = (magnitude & 0x7FFFFF) | 0x800000;
    uint32_t result = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (result & 1))) ++result;
    return sign | static_cast<uint16_t>(result);
  }
  uint32_t result = ((magnitude >> 13) - (112 << 10));
  const uint32_t rest = magnitude & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (result & 1))) ++result;
  return sign | static_cast<uint16_t>(result);
}

// A float rounded through fp16 (what llama.cpp keeps of a q8_0/q8_1 scale).
inline float round_fp16(float f) { return fp16_to_fp32(fp32_to_fp16(f)); }

// The little-endian fp16 at p (blocks are byte arrays: no alignment).
inline float load_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

}  // namespace quants
}  // namespace mlxprog
