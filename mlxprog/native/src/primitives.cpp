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
#include <nanobind/stl/vector.h>

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
  // `int8`: the int8 numerics (kernels_isa.inc; 4- and 8-bit codes,
  // transpose), else MLX's float numerics.
  QuantizedMatmul(mx::Stream stream, int group_size, int bits, bool transpose, bool int8)
      : CpuPrimitive(stream), group_size_(group_size), bits_(bits), transpose_(transpose),
        int8_(int8) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    enqueue(out, [x = inputs[0], w = inputs[1], scales = inputs[2], biases = inputs[3],
                  group_size = group_size_, bits = bits_, transpose = transpose_,
                  int8 = int8_](mx::array& out) mutable {
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
      std::vector<int8_t> xq(int8 ? p.M * p.K : 0);
      std::vector<float> xd(int8 ? p.M * groups : 0), xqsum(int8 ? p.M * groups : 0);
      const Kernels& kernels = *active_kernels;
      if (int8) {
        kernels.prepare_qmm_q8(contiguous_data(x, keep_x), dtype_of(x), p.M, p.K, bits,
                               group_size, xp.data(), xq.data(), xd.data(), xqsum.data());
        p.x = xp.data();  // xhat, for the kernels that multiply it in float
        p.xq = xq.data();
        p.xd = xd.data();
        p.xqsum = xqsum.data();
      } else {
        kernels.prepare_qmm_x(contiguous_data(x, keep_x), dtype_of(x), p.M, p.K, bits,
                              group_size, transpose, xp.data(), xsum.data());
        p.x = xp.data();
        p.xsum = xsum.data();
      }
      if (dtype_of(out) == DType::f32) {
        p.out = out.data<float>();
      } else {
        staged.resize(p.M * p.N);
        p.out = staged.data();
      }
      if (p.K == 0) {
        for (int64_t i = 0; i < p.M * p.N; ++i) p.out[i] = 0.f;
      } else if (int8) {
        ThreadPool::instance().parallel_for(
            p.N, grain_for(p.N, 4, 4, 64),
            [&](int64_t n0, int64_t n1) { kernels.qmm_q8(p, n0, n1); });
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
    return o && group_size_ == o->group_size_ && bits_ == o->bits_ &&
           transpose_ == o->transpose_ && int8_ == o->int8_;
  }

 private:
  int group_size_, bits_;
  bool transpose_, int8_;
};

mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, bool transpose, int group_size, int bits,
                           bool int8) {
  if (x.ndim() < 2 || w.ndim() != 2 || w.dtype() != mx::uint32)
    throw std::invalid_argument("mlxprog native quantized_matmul: unsupported operands");
  if (int8 && (!transpose || (bits != 4 && bits != 8)))
    throw std::invalid_argument(
        "mlxprog native quantized_matmul: int8 numerics need transpose and 4 or 8 bits");
  const mx::Dtype out_dtype = mx::promote_types(x.dtype(), scales.dtype());
  return mx::array(QuantizedMatmul::out_shape(x, w, bits, transpose), out_dtype,
                   std::make_shared<QuantizedMatmul>(mx::default_stream(mx::Device::cpu),
                                                     group_size, bits, transpose, int8),
                   {x, w, scales, biases});
}

// -- SwiGLU over the halves of a row -------------------------------------------------------

// silu(gate) * up with gate and up the two halves of x's last axis (a fused
// gate/up projection's output): one node instead of a split and the SwiGLU.
class SwigluHalves : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    enqueue(out, [x = inputs[0]](mx::array& out) mutable {
      std::vector<uint8_t> keep;
      SwigluProblem p{};
      p.x = static_cast<const float*>(contiguous_data(x, keep));
      p.out = out.data<float>();
      p.I = out.shape(-1);
      const int64_t rows = p.I ? static_cast<int64_t>(out.size()) / p.I : 0;
      const Kernels& kernels = *active_kernels;
      ThreadPool::instance().parallel_for(rows, grain_for(rows, 2, 1, 256),
                                          [&](int64_t r0, int64_t r1) { kernels.swiglu(p, r0, r1); });
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
          const int64_t n = static_cast<int64_t>(x.size());
          for (int64_t i = 0; i < n; ++i) s[i] = a[i] + b[i];
          RmsNormProblem p{};
          p.D = x.shape(-1);
          p.x = s;
          p.weight = contiguous_data(weight, keep_w);
          p.out = normed.data<void>();
          p.dtype = DType::f32;
          p.weight_dtype = DType::f32;
          p.eps = eps;
          const int64_t rows = p.D ? n / p.D : 0;
          const Kernels& kernels = *active_kernels;
          ThreadPool::instance().parallel_for(rows, grain_for(rows, 2, 8, 256), [&](int64_t r0,
                                                                                  int64_t r1) {
            kernels.rms_norm(p, r0, r1);
          });
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

// -- RoPE ----------------------------------------------------------------------------

// The RoPE kernel's dims / 2 inverse frequencies, already times `scale`:
// scale / freqs[i] where `freqs` is given, else scale * base ** (-2i / dims).
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

// -- a whole attention block: heads, RoPE, cache writes, attention ----------------------
//
// One node for what a decode step of a llama-style layer otherwise spends
// about eight on (reshape, splits, RoPE, two cache writes, attention, the
// merge of the heads): each node costs the main thread and the stream thread
// microseconds of scheduling, more than the work itself at one token.

// How many arrays hold `a`'s descriptor. mx::array is one shared_ptr to
// its descriptor (checked below), which MLX keeps private.
long descriptor_references(const mx::array& a) {
  static_assert(sizeof(mx::array) == sizeof(std::shared_ptr<void>),
                "mx::array is expected to hold only the shared_ptr to its descriptor");
  return reinterpret_cast<const std::shared_ptr<void>&>(a).use_count();
}

// Whether an input of a primitive with `outputs` outputs may give its buffer
// to an output: MLX's is_donatable() asks that nothing but the consuming
// node holds the input, but each output of a multi-output node keeps its
// own list of the node's inputs, so there it never holds (and every decode
// step would copy the whole KV cache). An input held by those lists alone
// has exactly `outputs` references; its buffer must be its own and MLX's.
bool donatable_input(const mx::array& in, size_t outputs) {
  const auto& data = in.data_shared_ptr();
  return descriptor_references(in) == static_cast<long>(outputs) && data &&
         data.use_count() == 1 && data->is_owned() && in.flags().row_contiguous;
}

// Give `out` the input cache's buffer when it may be donated, as MLX's own
// slice_update does; else a buffer of its own, which the task fills with a
// copy. Returns whether the buffer is shared.
bool share_or_allocate(const mx::array& in, mx::array& out, size_t outputs) {
  if (donatable_input(in, outputs)) {
    out.copy_shared_buffer(in);
    return true;
  }
  out.set_data(mx::allocator::malloc(out.nbytes()));
  return false;
}

class CacheAttentionBlock : public mx::Primitive {
 public:
  CacheAttentionBlock(mx::Stream stream, int heads, int kv_heads, int dims, bool traditional,
                      float base, float rope_scale, float scale, bool has_freqs,
                      bool has_key_mask)
      : mx::Primitive(stream), heads_(heads), kv_heads_(kv_heads), dims_(dims),
        traditional_(traditional), base_(base), rope_scale_(rope_scale), scale_(scale),
        has_freqs_(has_freqs), has_key_mask_(has_key_mask) {}

  // inputs: qkv [B, T, (H + 2 H_kv) D], k_cache and v_cache [B, H_kv, S, D]
  // (all float32), start (int32, one element: the clamped cache slot of
  // token 0), positions (int32, one or B: the RoPE position of token 0),
  // then freqs [dims / 2] and key_mask [B, S] (bool) where present.
  // outputs: attention [B, T, H D], the new k_cache and v_cache.
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const bool k_shared = share_or_allocate(inputs[1], outputs[1], outputs.size());
    const bool v_shared = share_or_allocate(inputs[2], outputs[2], outputs.size());
    outputs[0].set_data(mx::allocator::malloc(outputs[0].nbytes()));
    std::optional<mx::array> freqs, key_mask;
    size_t next = 5;
    if (has_freqs_) freqs = inputs[next++];
    if (has_key_mask_) key_mask = inputs[next++];
    mx::cpu::get_command_encoder(stream()).dispatch(
        [qkv = inputs[0], k_in = inputs[1], v_in = inputs[2], start_in = inputs[3],
         positions = inputs[4], freqs, key_mask, k_shared, v_shared,
         out = mx::array::unsafe_weak_copy(outputs[0]),
         k_out = mx::array::unsafe_weak_copy(outputs[1]),
         v_out = mx::array::unsafe_weak_copy(outputs[2]), H = int64_t{heads_},
         H_kv = int64_t{kv_heads_}, dims = dims_, traditional = traditional_, base = base_,
         rope_scale = rope_scale_, scale = scale_]() mutable {
          std::vector<uint8_t> keep_x, keep_s, keep_p, keep_f, keep_m, keep_k, keep_v;
          const int64_t B = k_in.shape(0), S = k_in.shape(2), D = k_in.shape(3);
          const int64_t T = qkv.shape(1), F = qkv.shape(2);
          float* k_cache = k_out.data<float>();
          float* v_cache = v_out.data<float>();
          if (!k_shared) std::memcpy(k_cache, contiguous_data(k_in, keep_k), k_out.nbytes());
          if (!v_shared) std::memcpy(v_cache, contiguous_data(v_in, keep_v), v_out.nbytes());
          const float* x = static_cast<const float*>(contiguous_data(qkv, keep_x));
          const int64_t start = *static_cast<const int32_t*>(contiguous_data(start_in, keep_s));
          // Heads out of the token-major projection: q [B, H, T, D] and the
          // new keys [B, H_kv, T, D], rotated in place; values go straight
          // into the cache.
          std::vector<float> q(B * H * T * D), k(B * H_kv * T * D);
          for (int64_t b = 0; b < B; ++b)
            for (int64_t t = 0; t < T; ++t) {
              const float* row = x + (b * T + t) * F;
              for (int64_t h = 0; h < H; ++h)
                std::memcpy(&q[((b * H + h) * T + t) * D], row + h * D, D * sizeof(float));
              for (int64_t h = 0; h < H_kv; ++h) {
                std::memcpy(&k[((b * H_kv + h) * T + t) * D], row + (H + h) * D,
                            D * sizeof(float));
                std::memcpy(v_cache + ((b * H_kv + h) * S + start + t) * D,
                            row + (H + H_kv + h) * D, D * sizeof(float));
              }
            }
          const std::vector<float> inv_freqs =
              rope_inv_freqs(dims, base, rope_scale, freqs, keep_f);
          const Kernels& kernels = *active_kernels;
          const int32_t* offsets = static_cast<const int32_t*>(contiguous_data(positions, keep_p));
          for (const std::pair<float*, int64_t>& heads : {std::pair<float*, int64_t>{q.data(), H},
                                                          std::pair<float*, int64_t>{k.data(), H_kv}}) {
            RopeProblem r{};
            r.x = heads.first;
            r.out = heads.first;  // the kernel reads a row before it writes it
            r.dtype = DType::f32;
            r.offsets = offsets;
            r.n_offsets = static_cast<int64_t>(positions.size());
            r.inv_freqs = inv_freqs.data();
            r.B = B;
            r.H = heads.second;
            r.T = T;
            r.D = D;
            r.dims = dims;
            r.traditional = traditional;
            const int64_t rows = B * heads.second * T;
            ThreadPool::instance().parallel_for(
                rows, grain_for(rows, 2, 8, 256),
                [&](int64_t r0, int64_t r1) { kernels.rope(r, r0, r1); });
          }
          for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < H_kv; ++h)
              std::memcpy(k_cache + ((b * H_kv + h) * S + start) * D, &k[(b * H_kv + h) * T * D],
                          T * D * sizeof(float));
          AttentionProblem a{};
          a.q = q.data();
          a.k = k_cache;
          a.v = v_cache;
          a.key_mask =
              key_mask ? static_cast<const uint8_t*>(contiguous_data(*key_mask, keep_m)) : nullptr;
          // One token: [B, H, 1, D] is already [B, 1, H D]; else a scratch
          // in head order, then tokens first.
          std::vector<float> heads_first(T == 1 ? 0 : B * H * T * D);
          a.out = T == 1 ? out.data<float>() : heads_first.data();
          a.B = B;
          a.H = H;
          a.T = T;
          a.D = D;
          a.H_kv = H_kv;
          a.S = S;
          a.start = start;
          a.scale = scale;
          ThreadPool::instance().parallel_for(B * H * T, 1, [&](int64_t i0, int64_t i1) {
            kernels.attention(a, i0, i1);
          });
          if (T != 1) {
            float* o = out.data<float>();
            for (int64_t b = 0; b < B; ++b)
              for (int64_t h = 0; h < H; ++h)
                for (int64_t t = 0; t < T; ++t)
                  std::memcpy(o + ((b * T + t) * H + h) * D,
                              &heads_first[((b * H + h) * T + t) * D], D * sizeof(float));
          }
        });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error(
        "MlxprogCacheAttentionBlock (an mlxprog native kernel) runs on the CPU only");
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const mx::Shape& x = inputs[0].shape();
    return {{x[0], x[1], heads_ * inputs[1].shape(3)}, inputs[1].shape(), inputs[2].shape()};
  }

  const char* name() const override { return "MlxprogCacheAttentionBlock"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const CacheAttentionBlock*>(&other);
    return o && o->heads_ == heads_ && o->kv_heads_ == kv_heads_ && o->dims_ == dims_ &&
           o->traditional_ == traditional_ && o->base_ == base_ &&
           o->rope_scale_ == rope_scale_ && o->scale_ == scale_ &&
           o->has_freqs_ == has_freqs_ && o->has_key_mask_ == has_key_mask_;
  }

 private:
  int heads_, kv_heads_, dims_;
  bool traditional_;
  float base_, rope_scale_, scale_;
  bool has_freqs_, has_key_mask_;
};

std::vector<mx::array> cache_attention_block(const mx::array& qkv, const mx::array& k_cache,
                                             const mx::array& v_cache, const mx::array& start,
                                             const mx::array& positions, int heads, int kv_heads,
                                             int dims, bool traditional, float base,
                                             float rope_scale, float scale,
                                             std::optional<mx::array> freqs,
                                             std::optional<mx::array> key_mask) {
  std::vector<mx::array> inputs = {qkv, k_cache, v_cache, start, positions};
  if (freqs) inputs.push_back(*freqs);
  if (key_mask) inputs.push_back(*key_mask);
  const mx::Shape out_shape = {qkv.shape(0), qkv.shape(1), heads * k_cache.shape(3)};
  return mx::array::make_arrays(
      {out_shape, k_cache.shape(), v_cache.shape()}, {mx::float32, mx::float32, mx::float32},
      std::make_shared<CacheAttentionBlock>(mx::default_stream(mx::Device::cpu), heads, kv_heads,
                                            dims, traditional, base, rope_scale, scale,
                                            freqs.has_value(), key_mask.has_value()),
      inputs);
}

}  // namespace
}  // namespace mlxprog

NB_MODULE(_mlxprog_native, m) {
  m.doc() = "mlxprog's native CPU kernels as MLX primitives";
  m.def("quantized_matmul", &mlxprog::quantized_matmul, nb::arg("x"), nb::arg("w"),
        nb::arg("scales"), nb::arg("biases"), nb::kw_only(), nb::arg("transpose"),
        nb::arg("group_size"), nb::arg("bits"), nb::arg("int8") = false,
        "x @ dequantize(w).T (transpose) or x @ dequantize(w), MLX's affine format; "
        "int8: x quantized to int8 per group and integer dot products (transpose, 4 or 8 "
        "bits).");
  m.def("add_rms_norm", &mlxprog::add_rms_norm, nb::arg("x"), nb::arg("y"), nb::arg("weight"),
        nb::kw_only(), nb::arg("eps"),
        "(x + y, rms_norm(x + y) * weight) for float32 x, y [..., D] and weight [D].");
  m.def("swiglu_halves", &mlxprog::swiglu_halves, nb::arg("x"),
        "silu(x[..., :I]) * x[..., I:] for float32 x [..., 2I].");
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
  m.def("cache_attention_block", &mlxprog::cache_attention_block, nb::arg("qkv"),
        nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("start"), nb::arg("positions"),
        nb::kw_only(), nb::arg("heads"), nb::arg("kv_heads"), nb::arg("dims"),
        nb::arg("traditional"), nb::arg("base"), nb::arg("rope_scale"), nb::arg("scale"),
        nb::arg("freqs").none() = nb::none(), nb::arg("key_mask").none() = nb::none(),
        "A fused attention block: q, k, v heads of qkv [B, T, (H + 2 H_kv) D], q and k "
        "rotated at positions[b] + t, k and v written into the caches [B, H_kv, S, D] at "
        "slot start, attention as cache_attention; returns (out [B, T, H D], k_cache, "
        "v_cache).");
  m.def("isa", [] { return std::string(mlxprog::active_kernels->isa); },
        "The instruction set of the kernels in use.");
  m.def("set_isa", [](const std::string& name) {
        if (name == "best") {
          mlxprog::active_kernels = &mlxprog::select_kernels();
          return;
        }
        const mlxprog::Kernels* named = mlxprog::kernels_named(name.c_str());
        if (!named)
          throw std::invalid_argument("no kernel table '" + name + "' usable here");
        mlxprog::active_kernels = named;
      }, nb::arg("name"),
      "Use the kernel table of that name ('portable', 'avx2', ...; see isas()), or 'best' "
      "(for tests; call it between evaluations).");
  m.def("isas", [] {
        std::vector<std::string> names;
        for (const char* name : {"avx2+avx512vnni", "avx2+avxvnni", "avx2", "neon+dotprod",
                                 "portable"})
          if (mlxprog::kernels_named(name)) names.emplace_back(name);
        return names;
      }, "The kernel tables built here that this CPU runs, best first.");
  m.def("threads", [] { return mlxprog::ThreadPool::instance().threads(); },
        "The kernels' thread count, the calling thread included.");
}
