// The norm-family primitives (the kernels: kernels/*/norms.h): the RMS norm,
// the residual add fused with it, and the SwiGLU over halves; and their
// Python functions rms_norm, add_rms_norm, swiglu_halves and swiglu.
#include "primitives/norms.h"

#include <memory>
#include <stdexcept>
#include <vector>

#include <nanobind/stl/vector.h>

#include "threadpool.h"

namespace mlxprog {

void run_rms_norm(const float* x, const void* weight, DType weight_dtype, int64_t rows,
                  int64_t D, float eps, float* out) {
  RmsNormProblem p{};
  p.D = D;
  p.x = x;
  p.weight = weight;
  p.out = out;
  p.dtype = DType::f32;
  p.weight_dtype = weight_dtype;
  p.eps = eps;
  const Kernels& kernels = *active_kernels;
  ThreadPool::instance().parallel_for(rows, grain_for(rows, 2, 8, 256),
                                      [&](int64_t r0, int64_t r1) { kernels.rms_norm(p, r0, r1); });
}

void run_swiglu(const float* gate, const float* up, int64_t stride, int64_t I, float* out,
                int64_t rows) {
  const SwigluProblem p{gate, up, out, I, stride};
  const Kernels& kernels = *active_kernels;
  ThreadPool::instance().parallel_for(rows, grain_for(rows, 2, 1, 256),
                                      [&](int64_t r0, int64_t r1) { kernels.swiglu(p, r0, r1); });
}

namespace {

// -- SwiGLU over the halves of a row -------------------------------------------------------

// silu(gate) * up with gate and up the two halves of x's last axis (a fused
// gate/up projection's output): one node instead of a split and the SwiGLU.
class SwigluHalves : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    enqueue(out, [x = inputs[0]](mx::array& out) mutable {
      std::vector<uint8_t> keep;
      const int64_t I = out.shape(-1);
      const float* halves = static_cast<const float*>(contiguous_data(x, keep));
      run_swiglu(halves, halves + I, 2 * I, I, out.data<float>(),
                 I ? static_cast<int64_t>(out.size()) / I : 0);
    });
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape shape = inputs[0].shape();
    shape.back() /= 2;
    return {shape};
  }

  const char* name() const override { return "MlxprogSwigluHalves"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const SwigluHalves*>(&other) != nullptr;
  }
};

mx::array swiglu_halves(const mx::array& x) {
  mx::Shape shape = x.shape();
  shape.back() /= 2;
  return mx::array(shape, mx::float32,
                   std::make_shared<SwigluHalves>(mx::default_stream(mx::Device::cpu)), {x});
}

// silu(gate) * up of two arrays of one shape (the gathered gate and up
// projections of a mixture of experts): the kernel of SwigluHalves on the
// two arrays, one node instead of MLX's three fused ops.
class Swiglu : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    enqueue(out, [gate = inputs[0], up = inputs[1]](mx::array& out) mutable {
      std::vector<uint8_t> keep_gate, keep_up;
      const float* g = static_cast<const float*>(contiguous_data(gate, keep_gate));
      const float* u = static_cast<const float*>(contiguous_data(up, keep_up));
      const int64_t I = out.shape(-1), rows = I ? static_cast<int64_t>(out.size()) / I : 0;
      run_swiglu(g, u, I, I, out.data<float>(), rows);
    });
  }

  const char* name() const override { return "MlxprogSwiglu"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const Swiglu*>(&other) != nullptr;
  }
};

mx::array swiglu(const mx::array& gate, const mx::array& up) {
  if (gate.dtype() != mx::float32 || up.dtype() != mx::float32 || gate.shape() != up.shape() ||
      gate.ndim() < 1)
    throw std::invalid_argument("mlxprog native swiglu: gate and up must be float32 arrays of "
                                "one shape");
  return mx::array(gate.shape(), mx::float32,
                   std::make_shared<Swiglu>(mx::default_stream(mx::Device::cpu)), {gate, up});
}

// -- RMS norm ------------------------------------------------------------------------

class RmsNorm : public CpuPrimitive {
 public:
  RmsNorm(mx::Stream stream, float eps) : CpuPrimitive(stream), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    enqueue(out, [x = inputs[0], weight = inputs[1], eps = eps_](mx::array& out) mutable {
      std::vector<uint8_t> keep_x, keep_w;
      RmsNormProblem p{};
      p.D = x.shape(-1);
      p.x = contiguous_data(x, keep_x);
      p.weight = contiguous_data(weight, keep_w);
      p.out = out.data<void>();
      p.dtype = dtype_of(x);
      p.weight_dtype = dtype_of(weight);
      p.eps = eps;
      const int64_t rows = p.D ? static_cast<int64_t>(x.size()) / p.D : 0;
      const Kernels& kernels = *active_kernels;
      ThreadPool::instance().parallel_for(rows, grain_for(rows, 2, 8, 256),
                                          [&](int64_t r0, int64_t r1) { kernels.rms_norm(p, r0, r1); });
    });
  }

  const char* name() const override { return "MlxprogRmsNorm"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const RmsNorm*>(&other);
    return o && o->eps_ == eps_;
  }

 private:
  float eps_;
};

mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps) {
  return mx::array(x.shape(), x.dtype(),
                   std::make_shared<RmsNorm>(mx::default_stream(mx::Device::cpu), eps),
                   {x, weight});
}

// -- residual add and RMS norm ------------------------------------------------------------

// (x + y, rms_norm(x + y) * weight) as one node: in a decode step every
// residual add is followed by a norm, and each node costs scheduling time.
class AddRmsNorm : public mx::Primitive {
 public:
  AddRmsNorm(mx::Stream stream, float eps) : mx::Primitive(stream), eps_(eps) {}

  // inputs: x and y [..., D] and weight [D], float32; outputs: the sum and its norm.
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    for (auto& o : outputs) o.set_data(mx::allocator::malloc(o.nbytes()));
    mx::cpu::get_command_encoder(stream()).dispatch(
        [x = inputs[0], y = inputs[1], weight = inputs[2],
         sum = mx::array::unsafe_weak_copy(outputs[0]),
         normed = mx::array::unsafe_weak_copy(outputs[1]), eps = eps_]() mutable {
          std::vector<uint8_t> keep_x, keep_y, keep_w;
          const float* a = static_cast<const float*>(contiguous_data(x, keep_x));
          const float* b = static_cast<const float*>(contiguous_data(y, keep_y));
          float* s = sum.data<float>();
          const int64_t n = static_cast<int64_t>(x.size()), D = x.shape(-1);
          for (int64_t i = 0; i < n; ++i) s[i] = a[i] + b[i];
          run_rms_norm(s, contiguous_data(weight, keep_w), DType::f32, D ? n / D : 0, D, eps,
                       normed.data<float>());
        });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("MlxprogAddRmsNorm (an mlxprog native kernel) runs on the CPU only");
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape(), inputs[0].shape()};
  }

  const char* name() const override { return "MlxprogAddRmsNorm"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const AddRmsNorm*>(&other);
    return o && o->eps_ == eps_;
  }

 private:
  float eps_;
};

std::vector<mx::array> add_rms_norm(const mx::array& x, const mx::array& y,
                                    const mx::array& weight, float eps) {
  return mx::array::make_arrays(
      {x.shape(), x.shape()}, {mx::float32, mx::float32},
      std::make_shared<AddRmsNorm>(mx::default_stream(mx::Device::cpu), eps), {x, y, weight});
}

}  // namespace

void bind_norms(nb::module_& m) {
  m.def("add_rms_norm", &add_rms_norm, nb::arg("x"), nb::arg("y"), nb::arg("weight"),
        nb::kw_only(), nb::arg("eps"),
        "(x + y, rms_norm(x + y) * weight) for float32 x, y [..., D] and weight [D].");
  m.def("swiglu_halves", &swiglu_halves, nb::arg("x"),
        "silu(x[..., :I]) * x[..., I:] for float32 x [..., 2I].");
  m.def("swiglu", &swiglu, nb::arg("gate"), nb::arg("up"),
        "silu(gate) * up for float32 gate and up of one shape (the kernel of swiglu_halves).");
  m.def("rms_norm", &rms_norm, nb::arg("x"), nb::arg("weight"), nb::kw_only(),
        nb::arg("eps"), "RMS norm over the last axis, as MLX's CPU rms_norm.");
}

}  // namespace mlxprog
