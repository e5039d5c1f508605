// The kernel tables without MLX, against scalar references: the quantized
// matmul for bits 2, 3, 4, 8, group sizes 32, 64, 128, one and three rows, its
// int8 numerics for bits 4 and 8 (one, two and nine rows), and the RMS norm. Built and run by tests/test_native.py with the host compiler
// (the table MLXPROG_NATIVE_ISA selects) and, where a cross compiler and
// qemu-aarch64 exist, for arm64 (the portable table, NEON).
#include "kernels.h"
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
using namespace mlxprog;
int main() {
  const Kernels& k = select_kernels();
  printf("table: %s\n", k.isa);
  int bad = 0;
  for (int bits : {2, 3, 4, 8}) for (int gs : {32, 64, 128}) for (int M : {1, 3}) {
    int64_t N = 24, K = 128;
    std::vector<uint8_t> w(N * K * bits / 8); for (auto& b : w) b = rand();
    std::vector<float> s(N * K / gs), b(N * K / gs), x(M * K), xp(M * K), xs(M * K / gs), out(M * N);
    for (auto& v : s) v = (rand() % 100) / 1000.f; for (auto& v : b) v = (rand() % 100) / 100.f - .5f;
    for (auto& v : x) v = (rand() % 1000) / 500.f - 1;
    k.prepare_qmm_x(x.data(), DType::f32, M, K, bits, gs, true, xp.data(), xs.data());
    QmmProblem p{xp.data(), xs.data(), w.data(), s.data(), b.data(), DType::f32, DType::f32, out.data(), M, N, K, bits, gs, true};
    k.qmm(p, 0, N);
    double worst = 0;
    for (int m = 0; m < M; ++m) for (int n = 0; n < N; ++n) {
      double ref = 0;
      for (int kk = 0; kk < K; ++kk) {
        int64_t bit = (int64_t)(n * K + kk) * bits; uint32_t code = 0;
        for (int i = 0; i < bits; ++i) code |= ((w[(bit + i) / 8] >> ((bit + i) % 8)) & 1) << i;
        int g = kk / gs; ref += (double)x[m * K + kk] * (s[n * (K / gs) + g] * code + b[n * (K / gs) + g]);
      }
      worst = std::fmax(worst, std::fabs(ref - out[m * N + n]) / (std::fabs(ref) + 1));
    }
    if (worst > 1e-5) { printf("qmm bits %d gs %d M %d: error %g\n", bits, gs, M, worst); ++bad; }
  }
  // int8 numerics: against the same integer sums in double precision.
  for (int bits : {4, 8}) for (int gs : {32, 64, 128}) for (int M : {1, 2, 9}) {
    int64_t N = 21, K = 256, G = K / gs;
    std::vector<uint8_t> w(N * K * bits / 8); for (auto& b : w) b = rand();
    std::vector<float> s(N * G), b(N * G), x(M * K), xp(M * K), xd(M * G), xqs(M * G), out(M * N);
    std::vector<int8_t> xq(M * K);
    for (auto& v : s) v = (rand() % 100) / 1000.f; for (auto& v : b) v = (rand() % 100) / 100.f - .5f;
    for (auto& v : x) v = (rand() % 1000) / 500.f - 1;
    k.prepare_qmm_q8(x.data(), DType::f32, M, K, bits, gs, xp.data(), xq.data(), xd.data(), xqs.data());
    QmmProblem p{xp.data(), nullptr, w.data(), s.data(), b.data(), DType::f32, DType::f32, out.data(), M, N, K, bits, gs, true,
                 xq.data(), xd.data(), xqs.data()};
    k.qmm_q8(p, 0, N);
    double worst = 0;
    for (int m = 0; m < M; ++m) for (int n = 0; n < N; ++n) {
      double ref = 0;
      for (int g = 0; g < G; ++g) {
        float amax = 0; for (int i = 0; i < gs; ++i) amax = std::fmax(amax, std::fabs(x[m * K + g * gs + i]));
        for (int i = 0; i < gs; ++i) {
          int kk = g * gs + i; int64_t bit = (int64_t)(n * K + kk) * bits; uint32_t code = 0;
          for (int j = 0; j < bits; ++j) code |= ((w[(bit + j) / 8] >> ((bit + j) % 8)) & 1) << j;
          double xhat = (double)(amax / 127.f) * std::rint(x[m * K + kk] * (127.f / amax));
          ref += xhat * (s[n * G + g] * code + b[n * G + g]);
        }
      }
      worst = std::fmax(worst, std::fabs(ref - out[m * N + n]) / (std::fabs(ref) + 1));
    }
    if (worst > 1e-5) { printf("qmm int8 bits %d gs %d M %d: error %g\n", bits, gs, M, worst); ++bad; }
  }
  // RMS norm
  std::vector<float> xr(3 * 20), wr(20, 2.f), outr(3 * 20);
  for (auto& v : xr) v = (rand() % 1000) / 500.f - 1;
  RmsNormProblem rp{xr.data(), wr.data(), outr.data(), DType::f32, DType::f32, 20, 1e-5f};
  k.rms_norm(rp, 0, 3);
  for (int r = 0; r < 3; ++r) { double ms = 0; for (int i = 0; i < 20; ++i) ms += xr[r*20+i]*xr[r*20+i]; ms /= 20;
    for (int i = 0; i < 20; ++i) if (std::fabs(xr[r*20+i] / std::sqrt(ms + 1e-5) * 2 - outr[r*20+i]) > 1e-5) { ++bad; printf("rms\n"); break; } }
  printf("%s\n", bad ? "FAILED" : "ok");
  return bad != 0;
}
