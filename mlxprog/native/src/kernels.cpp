// Kernel table selection and the scalar conversions every table shares.
#include <cstdlib>
#include <cstring>
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include "kernels.h"

namespace mlxprog {

namespace kernels_portable {
extern const Kernels table;
}
#if defined(__x86_64__) || defined(_M_X64)
namespace kernels_avx2 {
extern const Kernels table;
}
#endif
#if MLXPROG_HAVE_AVXVNNI
namespace kernels_avxvnni {
extern const Kernels table;
}
#endif
#if MLXPROG_HAVE_AVX512VNNI
namespace kernels_avx512vnni {
extern const Kernels table;
}
#endif
#if MLXPROG_HAVE_DOTPROD
namespace kernels_dotprod {
extern const Kernels table;
}
#endif

namespace {

#if defined(__aarch64__) && MLXPROG_HAVE_DOTPROD
bool cpu_has_dotprod() {
#if defined(__APPLE__)
  return true;  // every Apple arm64 CPU has it
#elif defined(__linux__)
  return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
  return false;
#endif
}
#endif

// The tables built into this binary that the CPU can run, best first.
int usable_tables(const Kernels* out[5]) {
  int n = 0;
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
#if MLXPROG_HAVE_AVX512VNNI
  if (avx2 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw"))
    out[n++] = &kernels_avx512vnni::table;
#endif
#if MLXPROG_HAVE_AVXVNNI
  if (avx2 && __builtin_cpu_supports("avxvnni")) out[n++] = &kernels_avxvnni::table;
#endif
  if (avx2) out[n++] = &kernels_avx2::table;
#endif
#if defined(__aarch64__) && MLXPROG_HAVE_DOTPROD
  if (cpu_has_dotprod()) out[n++] = &kernels_dotprod::table;
#endif
  out[n++] = &kernels_portable::table;
  return n;
}

}  // namespace

const Kernels& portable_kernels() { return kernels_portable::table; }

const Kernels* kernels_named(const char* name) {
  const Kernels* tables[5];
  const int n = usable_tables(tables);
  for (int i = 0; i < n; ++i)
    if (std::strcmp(tables[i]->isa, name) == 0) return tables[i];
  return nullptr;
}

const Kernels& select_kernels() {
  const char* forced = std::getenv("MLXPROG_NATIVE_ISA");
  if (forced && *forced) {
    const Kernels* named = kernels_named(forced);
    if (named) return *named;
  }
  const Kernels* tables[5];
  usable_tables(tables);
  return *tables[0];
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

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace mlxprog
