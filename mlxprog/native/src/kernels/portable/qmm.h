// portable: the quantized matmul in MLX's affine format (QmmProblem) and its
// int8 numerics, in plain C++. x86/qmm.h and arm/qmm.h take from here what
// they do not vectorize: x's preparation, the non-transposed product, the
// bit widths they lack.
#pragma once

#include <cstring>

#include "kernels/portable/vec.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace portable {

// Codes come 32 at a time (a chunk: 4 * bits bytes, byte aligned because a
// group is a multiple of 32 codes). For bits 2 and 4 a byte holds several
// codes, so the kernel reads them by bit plane (every low nibble, then every
// high nibble) and prepare_qmm_x stores x in that plane order: code c of
// plane p in a chunk is element c * (8 / bits) + p.

bool plane_order(int bits) { return bits == 2 || bits == 4; }

template <class Vec>
void prepare_qmm_x(const void* x, DType dtype, int64_t M, int64_t K, int bits,
                   int group_size, bool transpose, float* xp, float* xsum) {
  const int64_t groups = K / group_size;
  float* row = xp;
  for (int64_t m = 0; m < M; ++m, row += K) {
    Vec::load_row(x, dtype, m * K, K, row);
    if (!transpose) continue;
    for (int64_t g = 0; g < groups; ++g) {
      float s = 0.f;
      for (int64_t k = g * group_size; k < (g + 1) * group_size; ++k) s += row[k];
      xsum[m * groups + g] = s;
    }
    if (!plane_order(bits)) continue;
    const int per_byte = 8 / bits, per_plane = 32 / per_byte;
    float chunk[32];
    for (int64_t c = 0; c < K; c += 32) {
      for (int p = 0; p < per_byte; ++p)
        for (int i = 0; i < per_plane; ++i) chunk[p * per_plane + i] = row[c + i * per_byte + p];
      std::memcpy(row + c, chunk, sizeof(chunk));
    }
  }
}

// The 32 codes of one chunk as floats, in the order prepare_qmm_x stored x.
void decode_chunk(const uint8_t* src, int bits, float* dst) {
  if (bits == 8) {
    for (int i = 0; i < 32; ++i) dst[i] = src[i];
  } else if (plane_order(bits)) {
    const int per_byte = 8 / bits, per_plane = 32 / per_byte, mask = (1 << bits) - 1;
    for (int p = 0; p < per_byte; ++p)
      for (int i = 0; i < per_plane; ++i)
        dst[p * per_plane + i] = static_cast<float>((src[i] >> (p * bits)) & mask);
  } else {
    uint64_t acc = 0;
    int have = 0;
    const uint32_t mask = (1u << bits) - 1;
    for (int i = 0; i < 32; ++i) {
      while (have < bits) {
        acc |= static_cast<uint64_t>(*src++) << have;
        have += 8;
      }
      dst[i] = static_cast<float>(acc & mask);
      acc >>= bits;
      have -= bits;
    }
  }
}

// x @ dequantize(w).T, output columns [n0, n1): each group's dot product in
// eight lanes, then its scale and its bias times x's group sum.
void qmm_t(const QmmProblem& p, int64_t n0, int64_t n1) {
  const int64_t K = p.K, groups = K / p.group_size, row_bytes = K * p.bits / 8;
  const int chunks = p.group_size / 32, chunk_bytes = 4 * p.bits;
  float codes[32];
  for (int64_t m = 0; m < p.M; ++m) {
    const float* xr = p.x + m * K;
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* wrow = p.w + n * row_bytes;
      float total = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int c = 0; c < chunks; ++c) {
          const int64_t chunk = g * chunks + c;
          decode_chunk(wrow + chunk * chunk_bytes, p.bits, codes);
          const float* xc = xr + chunk * 32;
          for (int i = 0; i < 32; ++i) lanes[i % 8] += codes[i] * xc[i];
        }
        float dot = 0.f;
        for (float l : lanes) dot += l;
        total += load_float(p.scales, p.scales_dtype, n * groups + g) * dot +
                 load_float(p.biases, p.biases_dtype, n * groups + g) * p.xsum[m * groups + g];
      }
      p.out[m * p.N + n] = total;
    }
  }
}

// x @ dequantize(w) with w stored (K, N): rows of w are decoded and added to
// every row of the output, columns [n0, n1) (a multiple of group_size apart).
void qmm_n(const QmmProblem& p, int64_t n0, int64_t n1) {
  const int64_t K = p.K, N = p.N, groups = N / p.group_size, row_bytes = N * p.bits / 8;
  const int64_t width = n1 - n0;
  float* wf = new float[width];
  float codes[32];
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = n0; n < n1; ++n) p.out[m * N + n] = 0.f;
  for (int64_t k = 0; k < K; ++k) {
    const uint8_t* wrow = p.w + k * row_bytes;
    for (int64_t n = n0; n < n1; n += 32) {
      decode_chunk(wrow + (n / 32) * 4 * p.bits, p.bits, codes);
      const int64_t g = n / p.group_size;
      const float s = load_float(p.scales, p.scales_dtype, k * groups + g);
      const float b = load_float(p.biases, p.biases_dtype, k * groups + g);
      const int per_byte = plane_order(p.bits) ? 8 / p.bits : 1;
      const int per_plane = 32 / per_byte;
      // Back from plane order to element order.
      for (int i = 0; i < 32; ++i) {
        const int e = per_byte == 1 ? i : (i % per_plane) * per_byte + i / per_plane;
        wf[n - n0 + e] = s * codes[i] + b;
      }
    }
    for (int64_t m = 0; m < p.M; ++m) {
      const float xv = p.x[m * K + k];
      float* o = p.out + m * N + n0;
      for (int64_t j = 0; j < width; ++j) o[j] += xv * wf[j];
    }
  }
  delete[] wf;
}

void qmm(const QmmProblem& p, int64_t n0, int64_t n1) {
  if (!p.transpose) return qmm_n(p, n0, n1);
  qmm_t(p, n0, n1);
}

// -- int8 numerics ---------------------------------------------------------------------
//
// llama.cpp's numerics: each group of a row of x (the weight's group) is
// quantized to int8 with one float32 scale, d = max|x| / 127 and q = round(x
// * 127 / max|x|) (half to even), and the result is dequantize(w) @ xhat with
// xhat = d * q, computed with integer dot products per group:
//   out[m, n] = sum_g scale[n, g] * d[m, g] * sum_k code * q + bias[n, g] * d[m, g] * sum_k q.
// Every table computes the same integer sums; only the float32 combination
// of the groups differs in rounding. A group of x holding an infinity or NaN
// gets d = NaN, so the row's results are NaN.

template <class Vec>
void prepare_qmm_q8(const void* x, DType dtype, int64_t M, int64_t K, int bits,
                    int group_size, float* xp, int8_t* xq, float* xd, float* xqsum) {
  // The floats in the order the kernel reads codes (bit planes for 4 bits).
  float* unused_sums = new float[M * (K / group_size)];
  prepare_qmm_x<Vec>(x, dtype, M, K, bits, group_size, true, xp, unused_sums);
  delete[] unused_sums;
  const int64_t groups = K / group_size;
  for (int64_t i = 0; i < M * groups; ++i) {
    float* v = xp + i * group_size;
    int8_t* q = xq + i * group_size;
    float amax = 0.f;
    bool finite = true;
    for (int k = 0; k < group_size; ++k) {
      const float a = __builtin_fabsf(v[k]);
      finite &= a <= 3.4028234663852886e38f;  // false for inf and NaN
      amax = a > amax ? a : amax;
    }
    if (!finite || amax == 0.f) {
      for (int k = 0; k < group_size; ++k) {
        q[k] = 0;
        v[k] = finite ? 0.f : __builtin_nanf("");
      }
      xd[i] = finite ? 0.f : __builtin_nanf("");
      xqsum[i] = xd[i] * 0.f;
      continue;
    }
    const float inv = 127.f / amax, d = amax / 127.f;
    int32_t sum = 0;
    for (int k = 0; k < group_size; ++k) {
      const int32_t r = static_cast<int32_t>(__builtin_rintf(v[k] * inv));
      q[k] = static_cast<int8_t>(r);
      v[k] = d * static_cast<float>(r);
      sum += r;
    }
    xd[i] = d;
    xqsum[i] = d * static_cast<float>(sum);
  }
}

// The integer dot product of one group: codes of `bits` from `w` (plane
// order, as prepare_qmm_q8 stored q) with q.
int32_t group_dot_q8(const uint8_t* w, int bits, const int8_t* q, int group_size) {
  int32_t total = 0;
  for (int c = 0; c < group_size; c += 32, w += 4 * bits, q += 32) {
    if (bits == 8) {
      for (int i = 0; i < 32; ++i) total += static_cast<int32_t>(w[i]) * q[i];
    } else {  // 4 bits: low nibbles are codes 0..15, high nibbles 16..31
      for (int i = 0; i < 16; ++i)
        total += static_cast<int32_t>(w[i] & 0x0F) * q[i] + static_cast<int32_t>(w[i] >> 4) * q[16 + i];
    }
  }
  return total;
}

// Output columns [n0, n1) of the int8 numerics (4- and 8-bit codes, transpose).
void qmm_q8(const QmmProblem& p, int64_t n0, int64_t n1) {
  const int64_t K = p.K, gs = p.group_size, groups = K / gs, row_bytes = K * p.bits / 8;
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      float total = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t mg = m * groups + g, ng = n * groups + g;
        const int32_t dot = group_dot_q8(p.w + n * row_bytes + g * gs * p.bits / 8, p.bits,
                                         p.xq + mg * gs, static_cast<int>(gs));
        total += load_float(p.scales, p.scales_dtype, ng) * p.xd[mg] * static_cast<float>(dot) +
                 load_float(p.biases, p.biases_dtype, ng) * p.xqsum[mg];
      }
      p.out[m * p.N + n] = total;
    }
}

}  // namespace portable
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
