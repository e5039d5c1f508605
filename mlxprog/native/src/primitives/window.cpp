// The window reduction primitive (the window_sum/product/max/min ops of
// mlxprog/ops/window.py; the kernel: kernels/portable/window.h) and its
// Python function, window_reduce.
#include <algorithm>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "primitive.h"
#include "threadpool.h"

namespace mlxprog {
namespace {

// A window reduction's attributes, one entry per axis of x.
struct WindowSettings {
  WindowOp op;
  std::vector<int64_t> window, stride, dilation, pad_low, pad_high;
  bool operator==(const WindowSettings& o) const {
    return op == o.op && window == o.window && stride == o.stride && dilation == o.dilation &&
           pad_low == o.pad_low && pad_high == o.pad_high;
  }
};

// The result shape: the number of windows per axis.
mx::Shape window_shape(const mx::array& x, const WindowSettings& s) {
  if (s.window.size() != x.ndim())
    throw std::invalid_argument("mlxprog native window_reduce: the attributes need one entry "
                                "per axis of x " + shape_text(x.shape()));
  mx::Shape shape;
  for (size_t d = 0; d < x.ndim(); ++d) {
    const int64_t padded = x.shape(d) + s.pad_low[d] + s.pad_high[d];
    const int64_t span = (s.window[d] - 1) * s.dilation[d] + 1;
    if (span > padded)
      throw std::invalid_argument("mlxprog native window_reduce: the window does not fit in "
                                  "axis " + std::to_string(d));
    shape.push_back(static_cast<int>((padded - span) / s.stride[d] + 1));
  }
  return shape;
}

// The axes of a WindowProblem: x's axes with each run of axes the window
// leaves alone (window 1, stride 1, no padding) merged into one, since x is
// dense; the trailing run becomes the inner vector each step reduces whole
// (the channels of a channels-last pooling), leaving at least one outer axis.
struct WindowAxes {
  std::vector<int64_t> in, out, window, stride, dilation, pad, step;
  int64_t inner = 1;
};

WindowAxes window_axes(const mx::array& x, const WindowSettings& s) {
  const int nd = static_cast<int>(x.ndim());
  auto alone = [&](int d) {
    return s.window[d] == 1 && s.stride[d] == 1 && s.pad_low[d] == 0 && s.pad_high[d] == 0;
  };
  WindowAxes a;
  int end = nd;
  for (; end > 1 && alone(end - 1); --end) a.inner *= x.shape(end - 1);
  bool merging = false;  // the last outer axis is a run of axes left alone
  for (int d = 0; d < end; ++d) {
    if (alone(d) && merging) {
      a.in.back() *= x.shape(d);
      a.out.back() = a.in.back();
      continue;
    }
    merging = alone(d);
    a.in.push_back(x.shape(d));
    a.window.push_back(s.window[d]);
    a.stride.push_back(s.stride[d]);
    a.dilation.push_back(s.dilation[d]);
    a.pad.push_back(s.pad_low[d]);
    const int64_t span = (s.window[d] - 1) * s.dilation[d] + 1;
    a.out.push_back((x.shape(d) + s.pad_low[d] + s.pad_high[d] - span) / s.stride[d] + 1);
  }
  a.step.assign(a.in.size(), a.inner);
  for (int d = static_cast<int>(a.in.size()) - 2; d >= 0; --d)
    a.step[d] = a.step[d + 1] * a.in[d + 1];
  return a;
}

void run_window(const mx::array& x, const WindowSettings& s, mx::array& out) {
  std::vector<uint8_t> keep;
  const WindowAxes a = window_axes(x, s);
  WindowProblem p{static_cast<const float*>(contiguous_data(x, keep)),
                  out.data<float>(),
                  s.op,
                  static_cast<int>(a.in.size()),
                  a.in.data(),
                  a.out.data(),
                  a.window.data(),
                  a.stride.data(),
                  a.dilation.data(),
                  a.pad.data(),
                  a.step.data(),
                  a.inner};
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < a.out.size(); ++d) rows *= a.out[d];
  const Kernels& kernels = *active_kernels;
  ThreadPool::instance().parallel_for(rows, grain_for(rows, 4, 1, 64),
                                      [&](int64_t r0, int64_t r1) {
                                        kernels.window_reduce(p, r0, r1);
                                      });
}

class WindowReduce : public CpuPrimitive {
 public:
  WindowReduce(mx::Stream stream, WindowSettings settings)
      : CpuPrimitive(stream), settings_(std::move(settings)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    enqueue(out, [x = inputs[0], settings = settings_](mx::array& out) {
      run_window(x, settings, out);
    });
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {window_shape(inputs[0], settings_)};
  }

  const char* name() const override { return "MlxprogWindowReduce"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const WindowReduce*>(&other);
    return o && o->settings_ == settings_;
  }

 private:
  WindowSettings settings_;
};

mx::array window_reduce(const mx::array& x, const std::string& op, std::vector<int64_t> window,
                        std::vector<int64_t> stride, std::vector<int64_t> dilation,
                        std::vector<int64_t> pad_low, std::vector<int64_t> pad_high) {
  static const std::pair<const char*, WindowOp> ops[] = {
      {"sum", WindowOp::sum}, {"product", WindowOp::product}, {"max", WindowOp::max},
      {"min", WindowOp::min}};
  const auto* named = std::find_if(std::begin(ops), std::end(ops),
                                   [&](const auto& entry) { return op == entry.first; });
  if (named == std::end(ops))
    throw std::invalid_argument("mlxprog native window_reduce: no reduction '" + op + "'");
  if (x.dtype() != mx::float32 || x.ndim() == 0)
    throw std::invalid_argument("mlxprog native window_reduce: x must be float32, rank >= 1");
  const size_t nd = x.ndim();
  if (window.size() != nd || stride.size() != nd || dilation.size() != nd || pad_low.size() != nd ||
      pad_high.size() != nd)
    throw std::invalid_argument("mlxprog native window_reduce: the attributes need one entry "
                                "per axis of x " + shape_text(x.shape()));
  for (size_t d = 0; d < nd; ++d)
    if (window[d] < 1 || stride[d] < 1 || dilation[d] < 1 || pad_low[d] < 0 || pad_high[d] < 0)
      throw std::invalid_argument("mlxprog native window_reduce: windows, strides and "
                                  "dilations must be positive, padding not negative");
  WindowSettings settings{named->second, std::move(window), std::move(stride),
                          std::move(dilation), std::move(pad_low), std::move(pad_high)};
  mx::Shape shape = window_shape(x, settings);
  return mx::array(std::move(shape), mx::float32,
                   std::make_shared<WindowReduce>(mx::default_stream(mx::Device::cpu),
                                                  std::move(settings)),
                   {x});
}

}  // namespace

void bind_window(nb::module_& m) {
  m.def("window_reduce", &window_reduce, nb::arg("x"), nb::kw_only(), nb::arg("op"),
        nb::arg("window"), nb::arg("stride"), nb::arg("dilation"), nb::arg("pad_low"),
        nb::arg("pad_high"),
        "XLA's reduce_window of float32 x (rank >= 1) with op 'sum', 'product', 'max' or "
        "'min', one window size, stride, dilation and low / high padding per axis; "
        "padding adds the reduction's identity (max and min propagate NaN).");
}

}  // namespace mlxprog
