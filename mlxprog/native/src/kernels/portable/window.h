// portable: window reductions (XLA's reduce_window; WindowProblem). Plain
// C++ written as selects and element-wise loops that the compiler
// vectorizes for each table's instruction set; every table runs this one.
#pragma once

#include "kernels.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace portable {

// a (op) b. max and min propagate NaN, as MLX's reductions do: a NaN
// accumulator a stays, a NaN element b wins. Written as selects, which the
// compiler turns into vector compares and blends.
template <WindowOp op>
inline float window_step(float a, float b) {
  if constexpr (op == WindowOp::sum) return a + b;
  if constexpr (op == WindowOp::product) return a * b;
  if constexpr (op == WindowOp::max) return ((a > b) | (a != a)) ? a : b;
  return ((a < b) | (a != a)) ? a : b;
}

// acc[c] = acc[c] (op) v[c] for c < n: x and out never overlap.
template <WindowOp op>
inline void window_combine(float* __restrict acc, const float* __restrict v, int64_t n) {
  for (int64_t c = 0; c < n; ++c) acc[c] = window_step<op>(acc[c], v[c]);
}

// The value a window position in the padding contributes: the reduction's
// identity, so skipping such positions gives the padded result (-inf for max
// and +inf for min lose to every value and give way to NaN, as MLX's do).
template <WindowOp op>
constexpr float window_identity() {
  if constexpr (op == WindowOp::sum) return 0.f;
  if constexpr (op == WindowOp::product) return 1.f;
  if constexpr (op == WindowOp::max) return -__builtin_inff();
  return __builtin_inff();
}

// One row: the outputs along the last outer axis. The window positions on
// the other outer axes are walked once for the whole row (each a line of x
// inside the input, or padding, skipped), and along that line every output
// takes its window's elements: whole inner vectors, or with no inner vector
// (a window on the last axis, e.g. channels-first pooling) single floats.
template <WindowOp op>
void window_row(const WindowProblem& p, const int64_t* o, int64_t* w, float* dst) {
  const int last = p.rank - 1;
  const int64_t C = p.inner, outputs = p.out_shape[last], in = p.in[last];
  const int64_t stride = p.stride[last], dilation = p.dilation[last], pad = p.pad[last];
  const int64_t taps = p.window[last], step = p.in_step[last];
  for (int64_t c = 0; c < outputs * C; ++c) dst[c] = window_identity<op>();
  for (int d = 0; d < last; ++d) w[d] = 0;
  for (;;) {
    int64_t offset = 0;
    bool inside = true;
    for (int d = 0; d < last && inside; ++d) {
      const int64_t i = o[d] * p.stride[d] - p.pad[d] + w[d] * p.dilation[d];
      inside = i >= 0 && i < p.in[d];
      offset += i * p.in_step[d];
    }
    if (inside) {
      const float* line = p.x + offset;
      for (int64_t j = 0; j < outputs; ++j) {
        // The taps [t0, t1) whose element i = first + t * dilation is inside.
        const int64_t first = j * stride - pad;
        const int64_t t0 = first >= 0 ? 0 : (dilation - 1 - first) / dilation;
        const int64_t fit = in > first ? (in - first + dilation - 1) / dilation : 0;
        const int64_t t1 = fit < taps ? fit : taps;
        if (t0 >= t1) continue;  // a window of padding only
        const float* v = line + (first + t0 * dilation) * step;
        if (C == 1) {  // the accumulator stays in a register
          float acc = dst[j];
          for (int64_t t = t0; t < t1; ++t, v += dilation * step) acc = window_step<op>(acc, *v);
          dst[j] = acc;
          continue;
        }
        for (int64_t t = t0; t < t1; ++t, v += dilation * step)
          window_combine<op>(dst + j * C, v, C);
      }
    }
    int d = last - 1;
    while (d >= 0 && ++w[d] == p.window[d]) w[d--] = 0;
    if (d < 0) break;
  }
}

template <WindowOp op>
void window_rows(const WindowProblem& p, int64_t r0, int64_t r1) {
  const int last = p.rank - 1;
  int64_t* o = new int64_t[2 * p.rank];  // a row's output position, and a window position
  for (int64_t row = r0; row < r1; ++row) {
    int64_t rest = row;
    for (int d = last - 1; d >= 0; --d) {
      o[d] = rest % p.out_shape[d];
      rest /= p.out_shape[d];
    }
    window_row<op>(p, o, o + p.rank, p.out + row * p.out_shape[last] * p.inner);
  }
  delete[] o;
}

void window_reduce(const WindowProblem& p, int64_t r0, int64_t r1) {
  switch (p.op) {
    case WindowOp::sum: return window_rows<WindowOp::sum>(p, r0, r1);
    case WindowOp::product: return window_rows<WindowOp::product>(p, r0, r1);
    case WindowOp::max: return window_rows<WindowOp::max>(p, r0, r1);
    case WindowOp::min: return window_rows<WindowOp::min>(p, r0, r1);
  }
}

}  // namespace portable
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
