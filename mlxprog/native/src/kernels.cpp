// Kernel table selection and the scalar conversions every table shares.
#include <cstdlib>
#include <cstring>
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include "kernels.h"
#include "quants/common.h"

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

// The scalar conversions are the quant kernels' (one definition of each).
float half_to_float(uint16_t h) { return quants::fp16_to_fp32(h); }

uint16_t float_to_half(float f) { return quants::fp32_to_fp16(f); }

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace mlxprog
