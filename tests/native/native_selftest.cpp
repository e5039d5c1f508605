// The kernel tables without MLX, against scalar references: the quantized
// matmul for bits 2, 3, 4, 8, group sizes 32, 64, 128, one and three rows, its
// int8 numerics for bits 4 and 8 (one, two and nine rows), the RMS norm, the
// float32 GEMM (plain and as a convolution's implicit im2col) and the window
// reductions. Built and run by tests/native/test_native.py with the host
// compiler (the table MLXPROG_NATIVE_ISA selects) and, where a cross compiler
// and qemu-aarch64 exist, for arm64 (the portable table, NEON).
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
  // float32 GEMM: odd sizes past every block, B dense and transposed, and one
  // row (the unpacked path); then a strided, padded, dilated 2-D convolution.
  for (int bt = 0; bt < 2; ++bt) for (int64_t M : {1, 7, 150}) {
    const int64_t N = 37, K = 300;
    std::vector<float> a(M * K), bm(K * N), c(M * N), work(gemm_workspace(N));
    for (auto& v : a) v = (rand() % 1000) / 500.f - 1;
    for (auto& v : bm) v = (rand() % 1000) / 500.f - 1;
    GemmProblem gp{a.data(), K, 1, bm.data(), bt ? 1 : N, bt ? K : 1, c.data(), N, M, N, K, nullptr};
    k.sgemm(gp, 0, M, 0, N, work.data(), nullptr);
    double worst = 0;
    for (int64_t m = 0; m < M; ++m) for (int64_t n = 0; n < N; ++n) {
      double ref = 0;
      for (int64_t q = 0; q < K; ++q) ref += (double)a[m * K + q] * bm[bt ? n * K + q : q * N + n];
      worst = std::fmax(worst, std::fabs(ref - c[m * N + n]));
    }
    if (worst > 1e-4) { printf("sgemm M %ld transposed %d: error %g\n", (long)M, bt, worst); ++bad; }
  }
  {
    ConvGeometry g{5, 5, {1, 9, 8}, {1, 5, 3}, {1, 3, 2}, {1, 2, 3}, {0, 1, 0}, {1, 1, 2}};
    const int64_t batch = 2, co = 6, K = 3 * 2 * 5, M = batch * 5 * 3;
    std::vector<float> x(batch * 9 * 8 * 5), w(co * K), c(M * co), work(gemm_workspace(co));
    for (auto& v : x) v = (rand() % 1000) / 500.f - 1;
    for (auto& v : w) v = (rand() % 1000) / 500.f - 1;
    GemmProblem gp{x.data(), 0, 1, w.data(), 1, K, c.data(), co, M, co, K, &g};
    k.sgemm(gp, 0, M, 0, co, work.data(), nullptr);
    double worst = 0;
    for (int64_t m = 0; m < M; ++m) for (int64_t o = 0; o < co; ++o) {
      const int64_t n = m / 15, oh = (m / 3) % 5, ow = m % 3;
      double ref = 0;
      for (int kh = 0; kh < 3; ++kh) for (int kw = 0; kw < 2; ++kw) {
        const int64_t ih = oh * 2 - 1 + kh, iw = ow * 3 + kw * 2;
        if (ih < 0 || ih >= 9 || iw < 0 || iw >= 8) continue;
        for (int ch = 0; ch < 5; ++ch)
          ref += (double)x[((n * 9 + ih) * 8 + iw) * 5 + ch] * w[o * K + (kh * 2 + kw) * 5 + ch];
      }
      worst = std::fmax(worst, std::fabs(ref - c[m * co + o]));
    }
    if (worst > 1e-4) { printf("conv: error %g\n", worst); ++bad; }
  }
  // Window reductions: a max over vectors of 11 channels (with NaNs, which
  // propagate) and a sum over single floats (no inner vector), against
  // loops over the padded windows.
  for (const WindowOp op : {WindowOp::max, WindowOp::sum}) {
    const int64_t C = op == WindowOp::max ? 11 : 1;
    const int64_t in[2] = {7, 6}, out_shape[2] = {4, 5}, window[2] = {3, 2};
    const int64_t stride[2] = {2, 1}, dilation[2] = {1, 2}, pad[2] = {1, 1};
    const int64_t step[2] = {6 * C, C};
    std::vector<float> x(7 * 6 * C), out(4 * 5 * C);
    for (auto& v : x) v = (rand() % 1000) / 500.f - 1;
    x[5] = x[3 * 6 * C + 2] = NAN;
    WindowProblem wp{x.data(), out.data(), op, 2, in, out_shape, window, stride, dilation, pad,
                     step, C};
    k.window_reduce(wp, 0, 4);
    int wrong = 0;
    for (int64_t oh = 0; oh < 4; ++oh) for (int64_t ow = 0; ow < 5; ++ow) for (int64_t c = 0; c < C; ++c) {
      double ref = op == WindowOp::max ? -INFINITY : 0;
      bool nan = false;
      for (int64_t th = 0; th < 3; ++th) for (int64_t tw = 0; tw < 2; ++tw) {
        const int64_t ih = oh * 2 - 1 + th, iw = ow - 1 + tw * 2;
        if (ih < 0 || ih >= 7 || iw < 0 || iw >= 6) continue;
        const float v = x[(ih * 6 + iw) * C + c];
        nan |= std::isnan(v);
        ref = op == WindowOp::max ? std::fmax(ref, v) : ref + v;
      }
      const float got = out[(oh * 5 + ow) * C + c];
      wrong += nan ? !std::isnan(got) : !(std::fabs(got - ref) <= 1e-5);
    }
    if (wrong) { printf("window_reduce op %d: %d wrong\n", static_cast<int>(op), wrong); ++bad; }
  }
  printf("%s\n", bad ? "FAILED" : "ok");
  return bad != 0;
}
