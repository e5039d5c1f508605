// The exact integer matmul's driver (mlxprog/native/src/primitives/
// int_matmul_driver.h) alone, without MLX, against a naive product in uint64
// arithmetic reduced to each dtype: every dtype, random bits and extreme
// values, odd shapes, K = 0, transposed A, a B shared by the batch; on the
// portable table's micro-kernels and, where built and the CPU runs it, the
// AVX2 table's. Built with the kernel tables and run by
// tests/native/test_integer_matmul.py (on arm64 under qemu too); prints "ok"
// last.
#include <cstdint>
#include <cstdio>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "primitives/int_matmul_driver.h"

namespace {

using mlxprog::int_kernels::Operands;

struct Case {
  int64_t batch, M, K, N;
  bool transposed_a, shared_b, extremes;
};

template <class T>
T random_value(std::mt19937_64& rng, bool extremes) {
  using U = std::make_unsigned_t<T>;
  if (!extremes) return static_cast<T>(static_cast<U>(rng()));
  // 0, 1, the all-ones pattern (-1 or the maximum), and both ends of the range.
  const U picks[] = {0, 1, static_cast<U>(~U{0}), static_cast<U>(U{1} << (sizeof(T) * 8 - 1)),
                     static_cast<U>(~(U{1} << (sizeof(T) * 8 - 1)))};
  return static_cast<T>(picks[rng() % 5]);
}

template <class T>
bool check(std::mt19937_64& rng, const Case& c, const mlxprog::Kernels& table,
           const char* name) {
  using U = std::make_unsigned_t<T>;
  std::vector<T> a(c.batch * c.M * c.K), b((c.shared_b ? 1 : c.batch) * c.K * c.N);
  for (T& x : a) x = random_value<T>(rng, c.extremes);
  for (T& x : b) x = random_value<T>(rng, c.extremes);
  std::vector<T> out(c.batch * c.M * c.N, T{1});  // overwritten, zeros included
  std::vector<int64_t> a_offsets(c.batch), b_offsets(c.batch);
  for (int64_t i = 0; i < c.batch; ++i) {
    a_offsets[i] = i * c.M * c.K;
    b_offsets[i] = c.shared_b ? 0 : i * c.K * c.N;
  }
  Operands<T> p{};
  p.a = a.data();
  p.b = b.data();
  p.c = out.data();
  p.a_offsets = a_offsets.data();
  p.b_offsets = b_offsets.data();
  p.batch = c.batch;
  p.M = c.M;
  p.K = c.K;
  p.N = c.N;
  // A transposed: each batch element stored K x M.
  p.a_rs = c.transposed_a ? 1 : c.K;
  p.a_cs = c.transposed_a ? c.M : 1;
  p.b_rs = c.N;
  p.b_cs = 1;
  mlxprog::int_kernels::run(p, table.int_matmul);
  for (int64_t bi = 0; bi < c.batch; ++bi)
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) {
        uint64_t sum = 0;  // wraps modulo 2**64, which keeps the low bits right
        for (int64_t k = 0; k < c.K; ++k) {
          const T x = a[a_offsets[bi] + i * p.a_rs + k * p.a_cs];
          const T y = b[b_offsets[bi] + k * p.b_rs + j * p.b_cs];
          sum += static_cast<uint64_t>(static_cast<U>(x)) *
                 static_cast<uint64_t>(static_cast<U>(y));
        }
        const T got = out[(bi * c.M + i) * c.N + j];
        if (static_cast<U>(got) != static_cast<U>(sum)) {
          std::printf("%s %s batch=%lld M=%lld K=%lld N=%lld: C[%lld][%lld][%lld] differs\n",
                      name, table.isa, static_cast<long long>(c.batch), static_cast<long long>(c.M),
                      static_cast<long long>(c.K), static_cast<long long>(c.N),
                      static_cast<long long>(bi), static_cast<long long>(i),
                      static_cast<long long>(j));
          return false;
        }
      }
  return true;
}

template <class T>
bool check_all(std::mt19937_64& rng, const mlxprog::Kernels& table, const char* name) {
  const Case cases[] = {
      {1, 1, 1, 1, false, false, false},   {1, 7, 13, 5, false, false, true},
      {3, 37, 300, 41, true, false, false}, {2, 97, 257, 260, false, true, false},
      {1, 1160, 3, 17, false, false, true}, {4, 3, 0, 5, false, false, false},
      {5, 1, 40, 33, true, true, true},     {1, 13, 600, 6, false, false, true},
  };
  for (const Case& c : cases)
    if (!check<T>(rng, c, table, name)) return false;
  return true;
}

}  // namespace

int main() {
  std::mt19937_64 rng(7);
  for (const char* name : {"portable", "avx2"}) {
    const mlxprog::Kernels* table = mlxprog::kernels_named(name);
    if (!table) continue;  // not built here, or not run by this CPU
    const bool ok = check_all<int8_t>(rng, *table, "int8") &&
                    check_all<int16_t>(rng, *table, "int16") &&
                    check_all<int32_t>(rng, *table, "int32") &&
                    check_all<int64_t>(rng, *table, "int64") &&
                    check_all<uint8_t>(rng, *table, "uint8") &&
                    check_all<uint16_t>(rng, *table, "uint16") &&
                    check_all<uint32_t>(rng, *table, "uint32") &&
                    check_all<uint64_t>(rng, *table, "uint64");
    if (!ok) return 1;
    std::printf("%s micro-kernels: every dtype exact\n", name);
  }
  std::printf("ok\n");
  return 0;
}
