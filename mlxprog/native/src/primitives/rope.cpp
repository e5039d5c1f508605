// The rotary embedding primitive (the kernel: kernels/portable/rope.h) and
// its Python function, rope.
#include "primitives/rope.h"

#include <cmath>
#include <memory>

#include <nanobind/stl/optional.h>

#include "threadpool.h"

namespace mlxprog {

std::vector<float> rope_inv_freqs(int dims, float base, float scale,
                                  const std::optional<mx::array>& freqs,
                                  std::vector<uint8_t>& keep) {
  const int half = dims / 2;
  std::vector<float> inv_freqs(half);
  if (freqs) {
    const float* f = static_cast<const float*>(contiguous_data(*freqs, keep));
    for (int i = 0; i < half; ++i) inv_freqs[i] = scale / f[i];
  } else {
    const float log_base = std::log(base);
    for (int i = 0; i < half; ++i)
      inv_freqs[i] = scale * std::exp(-static_cast<float>(i) * (log_base / half));
  }
  return inv_freqs;
}

namespace {

class Rope : public CpuPrimitive {
 public:
  Rope(mx::Stream stream, int dims, bool traditional, float base, float scale, bool has_freqs)
      : CpuPrimitive(stream), dims_(dims), traditional_(traditional), base_(base),
        scale_(scale), has_freqs_(has_freqs) {}

  // inputs: x [B, ..., T, D], offsets int32 (size 1 or B), and freqs [dims/2]
  // when has_freqs.
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    std::optional<mx::array> freqs;
    if (has_freqs_) freqs = inputs[2];
    enqueue(out, [x = inputs[0], offsets = inputs[1], freqs, dims = dims_,
                  traditional = traditional_, base = base_,
                  scale = scale_](mx::array& out) mutable {
      std::vector<uint8_t> keep_x, keep_o, keep_f;
      RopeProblem p{};
      p.x = contiguous_data(x, keep_x);
      p.out = out.data<void>();
      p.dtype = dtype_of(x);
      p.offsets = static_cast<const int32_t*>(contiguous_data(offsets, keep_o));
      p.n_offsets = static_cast<int64_t>(offsets.size());
      p.D = x.shape(-1);
      p.T = x.shape(-2);
      p.B = x.shape(0);
      p.H = p.T * p.D ? static_cast<int64_t>(x.size()) / (p.B * p.T * p.D) : 0;
      p.dims = dims;
      p.traditional = traditional;
      const std::vector<float> inv_freqs = rope_inv_freqs(dims, base, scale, freqs, keep_f);
      p.inv_freqs = inv_freqs.data();
      const int64_t rows = p.B * p.H * p.T;
      const Kernels& kernels = *active_kernels;
      ThreadPool::instance().parallel_for(rows, grain_for(rows, 2, 8, 256),
                                          [&](int64_t r0, int64_t r1) { kernels.rope(p, r0, r1); });
    });
  }

  const char* name() const override { return "MlxprogRope"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const Rope*>(&other);
    return o && o->dims_ == dims_ && o->traditional_ == traditional_ && o->base_ == base_ &&
           o->scale_ == scale_ && o->has_freqs_ == has_freqs_;
  }

 private:
  int dims_;
  bool traditional_;
  float base_, scale_;
  bool has_freqs_;
};

mx::array rope(const mx::array& x, const mx::array& offsets, int dims, bool traditional,
               float base, float scale, std::optional<mx::array> freqs) {
  std::vector<mx::array> inputs = {x, offsets};
  if (freqs) inputs.push_back(*freqs);
  return mx::array(x.shape(), x.dtype(),
                   std::make_shared<Rope>(mx::default_stream(mx::Device::cpu), dims, traditional,
                                          base, scale, freqs.has_value()),
                   inputs);
}

}  // namespace

void bind_rope(nb::module_& m) {
  m.def("rope", &rope, nb::arg("x"), nb::arg("offsets"), nb::kw_only(),
        nb::arg("dims"), nb::arg("traditional"), nb::arg("base"), nb::arg("scale"),
        nb::arg("freqs").none() = nb::none(),
        "Rotary embedding of x [B, ..., T, D] at positions offsets[b] + t.");
}

}  // namespace mlxprog
