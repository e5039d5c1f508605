// Kernel table selection and the scalar conversions every table shares.
#include <cstdlib>
#include <cstring>

#include "kernels.h"

namespace mlxprog {

namespace portable {
extern const Kernels table;
}
#if defined(__x86_64__) || defined(_M_X64)
namespace avx2 {
extern const Kernels table;
}
#endif

const Kernels& portable_kernels() { return portable::table; }

const Kernels* avx2_kernels() {
#if defined(__x86_64__) || defined(_M_X64)
  return &avx2::table;
#else
  return nullptr;
#endif
}

const Kernels& select_kernels() {
  const char* forced = std::getenv("MLXPROG_NATIVE_ISA");
  if (forced && std::strcmp(forced, "portable") == 0) return portable_kernels();
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return *avx2_kernels();
#endif
  return portable_kernels();
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF, bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000 | (mantissa << 13);  // inf, nan
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

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = (x >> 16) & 0x8000;
  const uint32_t magnitude = x & 0x7FFFFFFF;
  if (magnitude >= 0x7F800000)  // inf or nan (nan stays quiet)
    return sign | 0x7C00 | (magnitude > 0x7F800000 ? 0x200 | ((magnitude >> 13) & 0x3FF) : 0);
  if (magnitude >= 0x477FF000) return sign | 0x7C00;  // rounds past the largest half
  if (magnitude < 0x38800000) {                        // subnormal or zero in half
    if (magnitude < 0x33000000) return sign;           // below half of the smallest
    const uint32_t shift = 126 - (magnitude >> 23);
    const uint32_t mantissa = (magnitude & 0x7FFFFF) | 0x800000;
    uint32_t result = mantissa >> (shift + 1);
    const uint32_t rest = mantissa & ((1u << (shift + 1)) - 1), half = 1u << shift;
    if (rest > half || (rest == half && (result & 1))) ++result;
    return sign | static_cast<uint16_t>(result);
  }
  uint32_t result = ((magnitude >> 13) - (112 << 10));
  const uint32_t rest = magnitude & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (result & 1))) ++result;
  return sign | static_cast<uint16_t>(result);
}

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace mlxprog
