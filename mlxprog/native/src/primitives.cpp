// mlxprog's MLX primitives and their Python module.
//
// Each primitive checks nothing about its operands' meaning: the Python side
// (mlxprog/native/__init__.py) calls it only for cases it covers, after the
// same checks MLX's own op makes. eval_cpu allocates the output and enqueues
// the kernel on the primitive's CPU stream; all reads of input data happen in
// that task, when earlier tasks have produced them.
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "kernels.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "threadpool.h"

namespace mx = mlx::core;
namespace nb = nanobind;

namespace mlxprog {
namespace {

const Kernels* active_kernels = &select_kernels();

DType dtype_of(const mx::array& a) {
  if (a.dtype() == mx::float32) return DType::f32;
  if (a.dtype() == mx::float16) return DType::f16;
  if (a.dtype() == mx::bfloat16) return DType::bf16;
  throw std::invalid_argument("mlxprog native: expected a float32, float16 or bfloat16 array");
}

// An input's data, row-contiguous: the array's own buffer, or a copy that
// gathers its strided elements (owned by `keep`), a row at a time where the
// last axis is dense.
const void* contiguous_data(const mx::array& a, std::vector<uint8_t>& keep) {
  if (a.flags().row_contiguous) return a.data<void>();
  const size_t item = a.itemsize();
  keep.resize(a.size() * item);
  if (a.size() == 0) return keep.data();
  const uint8_t* src = a.data<uint8_t>();
  uint8_t* dst = keep.data();
  const int nd = static_cast<int>(a.ndim());
  const int64_t last = nd ? a.shape(-1) : 1;
  const bool dense_rows = nd && a.strides()[nd - 1] == 1;
  const int outer = dense_rows ? nd - 1 : nd;  // axes walked one index at a time
  std::vector<int64_t> index(nd, 0);
  const size_t steps = dense_rows ? a.size() / last : a.size();
  const size_t chunk = dense_rows ? last * item : item;
  for (size_t i = 0; i < steps; ++i) {
    int64_t offset = 0;
    for (int d = 0; d < outer; ++d) offset += index[d] * a.strides()[d];
    std::memcpy(dst + i * chunk, src + offset * item, chunk);
    for (int d = outer - 1; d >= 0; --d) {
      if (++index[d] < a.shape(d)) break;
      index[d] = 0;
    }
  }
  return keep.data();
}

int64_t grain_for(int64_t n, int64_t per_thread_chunks, int64_t lo, int64_t hi) {
  const int64_t threads = ThreadPool::instance().threads();
  int64_t grain = n / (threads * per_thread_chunks);
  return grain < lo ? lo : (grain > hi ? hi : grain);
}

void write_output(const std::vector<float>& values, mx::array& out) {
  const DType t = dtype_of(out);
  if (t == DType::f32) return;  // the kernel wrote in place
  uint16_t* dst = out.data<uint16_t>();
  for (size_t i = 0; i < values.size(); ++i)
    dst[i] = t == DType::f16 ? float_to_half(values[i]) : float_to_bf16(values[i]);
}

// A primitive that runs only on the CPU: building one on another device's
// stream never happens (dispatch checks the device), and evaluating it there
// says so. Its output has the shape of its first input unless it overrides.
class CpuPrimitive : public mx::UnaryPrimitive {
 public:
  using mx::UnaryPrimitive::UnaryPrimitive;

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error(std::string(name()) + " (an mlxprog native kernel) runs on the CPU only");
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 protected:
  // Allocate `out`, then run `task(out)` on this primitive's CPU stream,
  // after the tasks that produce the inputs (all reads of input data go in
  // `task`). The task holds `out` weakly, as MLX's own primitives do.
  template <class Task>
  void enqueue(mx::array& out, Task task) {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    mx::cpu::get_command_encoder(stream()).dispatch(
        [task = std::move(task), out = mx::array::unsafe_weak_copy(out)]() mutable {
          task(out);
        });
  }
};

// -- quantized matmul -----------------------------------------------------------

class QuantizedMatmul : public CpuPrimitive {
 public:
  QuantizedMatmul(mx::Stream stream, int group_size, int bits, bool transpose)
      : CpuPrimitive(stream), group_size_(group_size), bits_(bits), transpose_(transpose) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    enqueue(out, [x = inputs[0], w = inputs[1], scales = inputs[2], biases = inputs[3],
                  group_size = group_size_, bits = bits_,
                  transpose = transpose_](mx::array& out) mutable {
      std::vector<uint8_t> keep_x, keep_w, keep_s, keep_b;
      QmmProblem p{};
      p.K = x.shape(-1);
      p.M = static_cast<int64_t>(x.size()) / (p.K ? p.K : 1);
      p.N = out.shape(-1);
      p.bits = bits;
      p.group_size = group_size;
      p.transpose = transpose;
      p.w = static_cast<const uint8_t*>(contiguous_data(w, keep_w));
      p.scales = contiguous_data(scales, keep_s);
      p.biases = contiguous_data(biases, keep_b);
      p.scales_dtype = dtype_of(scales);
      p.biases_dtype = dtype_of(biases);
      if (p.M == 0 || p.N == 0) return;
      const int64_t groups = (transpose ? p.K : p.N) / group_size;
      std::vector<float> xp(p.M * p.K), xsum(transpose ? p.M * groups : 0), staged;
      const Kernels& kernels = *active_kernels;
      kernels.prepare_qmm_x(contiguous_data(x, keep_x), dtype_of(x), p.M, p.K, bits, group_size,
                            transpose, xp.data(), xsum.data());
      p.x = xp.data();
      p.xsum = xsum.data();
      if (dtype_of(out) == DType::f32) {
        p.out = out.data<float>();
      } else {
        staged.resize(p.M * p.N);
        p.out = staged.data();
      }
      if (p.K == 0) {
        for (int64_t i = 0; i < p.M * p.N; ++i) p.out[i] = 0.f;
      } else if (transpose) {
        ThreadPool::instance().parallel_for(
            p.N, grain_for(p.N, 4, 4, 64),
            [&](int64_t n0, int64_t n1) { kernels.qmm(p, n0, n1); });
      } else {
        ThreadPool::instance().parallel_for(
            groups, grain_for(groups, 2, 1, 64), [&](int64_t g0, int64_t g1) {
              kernels.qmm(p, g0 * group_size, g1 * group_size);
            });
      }
      write_output(staged, out);
    });
  }


  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {out_shape(inputs[0], inputs[1], bits_, transpose_)};
  }

  static mx::Shape out_shape(const mx::array& x, const mx::array& w, int bits, bool transpose) {
    mx::Shape shape = x.shape();
    shape.back() = transpose ? w.shape(0) : w.shape(1) * 32 / bits;
    return shape;
  }

  const char* name() const override { return "MlxprogQuantizedMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const QuantizedMatmul*>(&other);
    return o && group_size_ == o->group_size_ && bits_ == o->bits_ && transpose_ == o->transpose_;
  }

 private:
  int group_size_, bits_;
  bool transpose_;
};

mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, bool transpose, int group_size, int bits) {
  if (x.ndim() < 2 || w.ndim() != 2 || w.dtype() != mx::uint32)
    throw std::invalid_argument("mlxprog native quantized_matmul: unsupported operands");
  const mx::Dtype out_dtype = mx::promote_types(x.dtype(), scales.dtype());
  return mx::array(QuantizedMatmul::out_shape(x, w, bits, transpose), out_dtype,
                   std::make_shared<QuantizedMatmul>(mx::default_stream(mx::Device::cpu),
                                                     group_size, bits, transpose),
                   {x, w, scales, biases});
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

// -- RoPE ----------------------------------------------------------------------------

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
      const int half = dims / 2;
      std::vector<float> inv_freqs(half);
      if (freqs) {
        const float* f = static_cast<const float*>(contiguous_data(*freqs, keep_f));
        for (int i = 0; i < half; ++i) inv_freqs[i] = scale / f[i];
      } else {
        const float log_base = std::log(base);
        for (int i = 0; i < half; ++i)
          inv_freqs[i] = scale * std::exp(-static_cast<float>(i) * (log_base / half));
      }
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

// -- attention over a KV cache ------------------------------------------------------------

class CacheAttention : public CpuPrimitive {
 public:
  CacheAttention(mx::Stream stream, float scale, bool has_key_mask)
      : CpuPrimitive(stream), scale_(scale), has_key_mask_(has_key_mask) {}

  // inputs: q [B, H, T, D], k and v [B, H_kv, S, D] (float32), start (int32,
  // one element), and key_mask [B, S] (bool) when has_key_mask.
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    std::optional<mx::array> key_mask;
    if (has_key_mask_) key_mask = inputs[4];
    enqueue(out, [q = inputs[0], k = inputs[1], v = inputs[2], start = inputs[3], key_mask,
                  scale = scale_](mx::array& out) mutable {
      std::vector<uint8_t> keep_q, keep_k, keep_v, keep_s, keep_m;
      AttentionProblem p{};
      p.q = static_cast<const float*>(contiguous_data(q, keep_q));
      p.k = static_cast<const float*>(contiguous_data(k, keep_k));
      p.v = static_cast<const float*>(contiguous_data(v, keep_v));
      p.key_mask = key_mask ? static_cast<const uint8_t*>(contiguous_data(*key_mask, keep_m))
                            : nullptr;
      p.out = out.data<float>();
      p.B = q.shape(0);
      p.H = q.shape(1);
      p.T = q.shape(2);
      p.D = q.shape(3);
      p.H_kv = k.shape(1);
      p.S = k.shape(2);
      p.start = *static_cast<const int32_t*>(contiguous_data(start, keep_s));
      p.scale = scale;
      const Kernels& kernels = *active_kernels;
      // Work items: (batch, head, query position) triples.
      ThreadPool::instance().parallel_for(p.B * p.H * p.T, 1, [&](int64_t i0, int64_t i1) {
        kernels.attention(p, i0, i1);
      });
    });
  }

  const char* name() const override { return "MlxprogCacheAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const CacheAttention*>(&other);
    return o && o->scale_ == scale_ && o->has_key_mask_ == has_key_mask_;
  }

 private:
  float scale_;
  bool has_key_mask_;
};

mx::array cache_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                          const mx::array& start, std::optional<mx::array> key_mask,
                          float scale) {
  std::vector<mx::array> inputs = {q, k, v, start};
  if (key_mask) inputs.push_back(*key_mask);
  return mx::array(q.shape(), mx::float32,
                   std::make_shared<CacheAttention>(mx::default_stream(mx::Device::cpu), scale,
                                                    key_mask.has_value()),
                   inputs);
}

}  // namespace
}  // namespace mlxprog

NB_MODULE(_mlxprog_native, m) {
  m.doc() = "mlxprog's native CPU kernels as MLX primitives";
  m.def("quantized_matmul", &mlxprog::quantized_matmul, nb::arg("x"), nb::arg("w"),
        nb::arg("scales"), nb::arg("biases"), nb::kw_only(), nb::arg("transpose"),
        nb::arg("group_size"), nb::arg("bits"),
        "x @ dequantize(w).T (transpose) or x @ dequantize(w), MLX's affine format.");
  m.def("rms_norm", &mlxprog::rms_norm, nb::arg("x"), nb::arg("weight"), nb::kw_only(),
        nb::arg("eps"), "RMS norm over the last axis, as MLX's CPU rms_norm.");
  m.def("rope", &mlxprog::rope, nb::arg("x"), nb::arg("offsets"), nb::kw_only(),
        nb::arg("dims"), nb::arg("traditional"), nb::arg("base"), nb::arg("scale"),
        nb::arg("freqs").none() = nb::none(),
        "Rotary embedding of x [B, ..., T, D] at positions offsets[b] + t.");
  m.def("cache_attention", &mlxprog::cache_attention, nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("start"), nb::arg("key_mask").none() = nb::none(), nb::kw_only(),
        nb::arg("scale"),
        "Attention of q [B, H, T, D] over caches [B, H_kv, S, D]: query t sees key j "
        "when j <= start + t and key_mask[b, j]; a query that sees no key gets zeros.");
  m.def("isa", [] { return std::string(mlxprog::active_kernels->isa); },
        "The instruction set of the kernels in use.");
  m.def("set_isa", [](const std::string& name) {
        if (name == "portable") {
          mlxprog::active_kernels = &mlxprog::portable_kernels();
        } else if (name == "best") {
          mlxprog::active_kernels = &mlxprog::select_kernels();
        } else {
          throw std::invalid_argument("isa must be 'portable' or 'best'");
        }
      }, nb::arg("name"),
      "Use the portable kernels, or the best the CPU supports (for tests; call it "
      "between evaluations).");
  m.def("threads", [] { return mlxprog::ThreadPool::instance().threads(); },
        "The kernels' thread count, the calling thread included.");
}
