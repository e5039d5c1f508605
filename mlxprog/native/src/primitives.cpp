// mlxprog's MLX primitives and their Python module.
//
// Each primitive checks nothing about its operands' meaning: the Python side
// (mlxprog/native/__init__.py) calls it only for cases it covers, after the
// same checks MLX's own op makes. eval_cpu allocates the output and enqueues
// the kernel on the primitive's CPU stream; all reads of input data happen in
// that task, when earlier tasks have produced them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
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
#include "int_matmul.h"
#include "quant_matmul.h"

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

#include "gemm_conv.inc"
#include "window.inc"

// -- quantized matmul -----------------------------------------------------------

// A quantized matmul's operands as the kernels read them: packed codes and
// per-group scales and biases, row-contiguous.
struct PackedMatrix {
  const uint8_t* w;
  const void* scales;
  const void* biases;
  DType scales_dtype, biases_dtype;
  int bits, group_size;
};

PackedMatrix packed_matrix(const mx::array& w, const mx::array& scales, const mx::array& biases,
                           int bits, int group_size, std::vector<uint8_t>& keep_w,
                           std::vector<uint8_t>& keep_s, std::vector<uint8_t>& keep_b) {
  return {static_cast<const uint8_t*>(contiguous_data(w, keep_w)),
          contiguous_data(scales, keep_s),
          contiguous_data(biases, keep_b),
          dtype_of(scales),
          dtype_of(biases),
          bits,
          group_size};
}

// out (M x N float32) = x (M x K, `x_dtype`) @ dequantize(m).T (transpose)
// or x @ dequantize(m); `int8`: the int8 numerics (transpose, 4 or 8 bits).
// Runs on the calling thread and the pool.
void run_qmm(const void* x, DType x_dtype, int64_t M, int64_t K, int64_t N,
             const PackedMatrix& m, bool transpose, bool int8, float* out) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M * N; ++i) out[i] = 0.f;
    return;
  }
  QmmProblem p{};
  p.M = M;
  p.N = N;
  p.K = K;
  p.bits = m.bits;
  p.group_size = m.group_size;
  p.transpose = transpose;
  p.w = m.w;
  p.scales = m.scales;
  p.biases = m.biases;
  p.scales_dtype = m.scales_dtype;
  p.biases_dtype = m.biases_dtype;
  p.out = out;
  const int64_t groups = (transpose ? K : N) / m.group_size;
  std::vector<float> xp(M * K), xsum(transpose ? M * groups : 0);
  std::vector<int8_t> xq(int8 ? M * K : 0);
  std::vector<float> xd(int8 ? M * groups : 0), xqsum(int8 ? M * groups : 0);
  const Kernels& kernels = *active_kernels;
  p.x = xp.data();  // int8: xhat, for the kernels that multiply it in float
  if (int8) {
    kernels.prepare_qmm_q8(x, x_dtype, M, K, m.bits, m.group_size, xp.data(), xq.data(),
                           xd.data(), xqsum.data());
    p.xq = xq.data();
    p.xd = xd.data();
    p.xqsum = xqsum.data();
    ThreadPool::instance().parallel_for(N, grain_for(N, 4, 4, 64),
                                        [&](int64_t n0, int64_t n1) { kernels.qmm_q8(p, n0, n1); });
    return;
  }
  kernels.prepare_qmm_x(x, x_dtype, M, K, m.bits, m.group_size, transpose, xp.data(),
                        xsum.data());
  p.xsum = xsum.data();
  if (transpose) {
    ThreadPool::instance().parallel_for(N, grain_for(N, 4, 4, 64),
                                        [&](int64_t n0, int64_t n1) { kernels.qmm(p, n0, n1); });
  } else {
    ThreadPool::instance().parallel_for(
        groups, grain_for(groups, 2, 1, 64), [&](int64_t g0, int64_t g1) {
          kernels.qmm(p, g0 * m.group_size, g1 * m.group_size);
        });
  }
}

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
      const int64_t K = x.shape(-1);
      const int64_t M = static_cast<int64_t>(x.size()) / (K ? K : 1);
      const int64_t N = out.shape(-1);
      std::vector<float> staged(dtype_of(out) == DType::f32 ? 0 : M * N);
      run_qmm(contiguous_data(x, keep_x), dtype_of(x), M, K, N,
              packed_matrix(w, scales, biases, bits, group_size, keep_w, keep_s, keep_b),
              transpose, int8, staged.empty() ? out.data<float>() : staged.data());
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

// rows x D: out = rms_norm(x) * weight.
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

// A KV cache's layout: float32 keys and values (kv_bits 0), or MLX's affine
// quantization of them (kv_bits 4 or 8, groups of kv_group_size features),
// with hadamard of each group's Walsh-Hadamard transform (AttentionProblem).
struct CacheFormat {
  int kv_bits = 0;
  int kv_group_size = 0;
  bool hadamard = false;

  bool quantized() const { return kv_bits != 0; }
  // The arrays a cache is: k and v, or the codes, scales and biases of each.
  size_t arrays() const { return quantized() ? 6 : 2; }
  bool operator==(const CacheFormat& o) const {
    return kv_bits == o.kv_bits && kv_group_size == o.kv_group_size && hadamard == o.hadamard;
  }
};

// MLX's affine quantization (mx.quantize, bit for bit) of `rows` rows of D
// floats in groups of `group_size`: each group's scale and bias put its
// extreme value of larger magnitude exactly on a code; codes are packed
// little-endian, D * bits / 8 bytes a row.
void quantize_rows(const float* x, int64_t rows, int64_t D, int bits, int64_t group_size,
                   uint8_t* codes, float* scales, float* biases) {
  const float n_bins = static_cast<float>((1 << bits) - 1), eps = 1e-7f;
  const int64_t groups = D / group_size;
  for (int64_t g = 0; g < rows * groups; ++g) {
    const float* w = x + g * group_size;
    float w_min = std::numeric_limits<float>::infinity(), w_max = -w_min;
    for (int64_t j = 0; j < group_size; ++j) {
      w_max = std::max(w_max, w[j]);
      w_min = std::min(w_min, w[j]);
    }
    const bool low_edge = std::abs(w_min) > std::abs(w_max);
    float scale = std::max((w_max - w_min) / n_bins, eps);
    scale = low_edge ? scale : -scale;
    const float edge = low_edge ? w_min : w_max;
    const float q0 = std::rint(edge / scale);
    float bias = 0.f;
    if (q0 != 0.f) {
      scale = edge / q0;
      bias = edge;
    }
    uint8_t* out = codes + g * group_size * bits / 8;
    for (int64_t j = 0; j < group_size; ++j) {
      const float q = std::min(std::max(std::rint((w[j] - bias) / scale), 0.f), n_bins);
      const auto code = static_cast<uint8_t>(q);
      if (bits == 8)
        out[j] = code;
      else if (j % 2 == 0)
        out[j / 2] = code;
      else
        out[j / 2] |= static_cast<uint8_t>(code << 4);
    }
    scales[g] = scale;
    biases[g] = bias;
  }
}

// A cache's arrays as the attention kernels read them: `arrays` holds k and
// v, or k's codes, scales, biases and v's (row-contiguous data pointers).
void set_cache(AttentionProblem& p, const CacheFormat& format, const void* const* arrays) {
  p.kv_bits = format.kv_bits;
  p.kv_group_size = format.kv_group_size;
  p.kv_hadamard = format.hadamard;
  if (!format.quantized()) {
    p.k = static_cast<const float*>(arrays[0]);
    p.v = static_cast<const float*>(arrays[1]);
    return;
  }
  for (int kind = 0; kind < 2; ++kind) {
    QuantizedRows& rows = kind ? p.v_quantized : p.k_quantized;
    rows.codes = static_cast<const uint8_t*>(arrays[3 * kind]);
    rows.scales = static_cast<const float*>(arrays[3 * kind + 1]);
    rows.biases = static_cast<const float*>(arrays[3 * kind + 2]);
  }
}

// A quantized cache's float window as the kernel reads it (RecentRows), of R
// entries: `arrays` holds k_recent, v_recent, recent_slots, then the step's
// new keys and values (row-contiguous data pointers).
void set_recent(AttentionProblem& p, int64_t R, const void* const* arrays) {
  p.recent = {R,
              static_cast<const float*>(arrays[0]),
              static_cast<const float*>(arrays[1]),
              static_cast<const int32_t*>(arrays[2]),
              static_cast<const float*>(arrays[3]),
              static_cast<const float*>(arrays[4])};
}

// Run the attention kernel of p's cache format on the pool: work items are
// query rows (float), or (batch, KV head, query position) (quantized).
void run_attention(const AttentionProblem& p) {
  const Kernels& kernels = *active_kernels;
  if (p.kv_bits == 0) {
    ThreadPool::instance().parallel_for(p.B * p.H * p.T, 1, [&](int64_t i0, int64_t i1) {
      kernels.attention(p, i0, i1);
    });
    return;
  }
  ThreadPool::instance().parallel_for(p.B * p.H_kv * p.T, 1, [&](int64_t i0, int64_t i1) {
    kernels.attention_quantized(p, i0, i1);
  });
}

// The head dim of a cache whose first array is `k` (quantized: packed codes).
int64_t cache_head_dim(const mx::array& k, const CacheFormat& format) {
  return format.quantized() ? k.shape(3) * 32 / format.kv_bits : k.shape(3);
}

class CacheAttention : public CpuPrimitive {
 public:
  CacheAttention(mx::Stream stream, float scale, bool has_key_mask, int64_t window,
                 float softcap, CacheFormat format, bool has_recent)
      : CpuPrimitive(stream), scale_(scale), has_key_mask_(has_key_mask), window_(window),
        softcap_(softcap), format_(format), has_recent_(has_recent) {}

  // inputs: q [B, H, T, D] (float32), the cache's arrays (k and v [B, H_kv,
  // S, D] float32, or of each the codes [B, H_kv, S, D * bits / 32] uint32
  // and the scales and biases [B, H_kv, S, D / group_size] float32), start
  // (int32, one element), key_mask [B, S] (bool) when has_key_mask, and a
  // quantized cache's float window when has_recent: k_recent, v_recent [B,
  // H_kv, R, D] (float32), recent_slots [B, R] (int32), new_k, new_v [B,
  // H_kv, T, D] (float32), see RecentRows.
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    enqueue(out, [inputs, scale = scale_, has_key_mask = has_key_mask_, window = window_,
                  softcap = softcap_, format = format_,
                  has_recent = has_recent_](mx::array& out) mutable {
      const size_t n = format.arrays();
      std::vector<std::vector<uint8_t>> keep(inputs.size());
      std::vector<const void*> cache(n);
      for (size_t i = 0; i < n; ++i) cache[i] = contiguous_data(inputs[1 + i], keep[1 + i]);
      const mx::array& q = inputs[0];
      AttentionProblem p{};
      p.q = static_cast<const float*>(contiguous_data(q, keep[0]));
      set_cache(p, format, cache.data());
      p.key_mask = has_key_mask ? static_cast<const uint8_t*>(
                                      contiguous_data(inputs[n + 2], keep[n + 2]))
                                : nullptr;
      p.out = out.data<float>();
      p.B = q.shape(0);
      p.H = q.shape(1);
      p.T = q.shape(2);
      p.D = q.shape(3);
      p.H_kv = inputs[1].shape(1);
      p.S = inputs[1].shape(2);
      p.start = *static_cast<const int32_t*>(contiguous_data(inputs[n + 1], keep[n + 1]));
      p.scale = scale;
      p.window = window;
      p.softcap = softcap;
      if (has_recent) {
        const size_t first = n + 2 + (has_key_mask ? 1 : 0);
        const void* ring[5];
        for (size_t i = 0; i < 5; ++i)
          ring[i] = contiguous_data(inputs[first + i], keep[first + i]);
        set_recent(p, inputs[first].shape(2), ring);
      }
      run_attention(p);
    });
  }

  const char* name() const override { return "MlxprogCacheAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const CacheAttention*>(&other);
    return o && o->scale_ == scale_ && o->has_key_mask_ == has_key_mask_ &&
           o->window_ == window_ && o->softcap_ == softcap_ && o->format_ == format_ &&
           o->has_recent_ == has_recent_;
  }

 private:
  float scale_;
  bool has_key_mask_;
  int64_t window_;
  float softcap_;
  CacheFormat format_;
  bool has_recent_;
};

// The cache format of `caches` (two float32 arrays, or six of a quantized
// cache with kv_bits 4 or 8), checked; `where` names the caller.
CacheFormat cache_format(const std::vector<mx::array>& caches, int kv_bits, int kv_group_size,
                         bool kv_hadamard, const char* where) {
  const CacheFormat format{kv_bits, kv_group_size, kv_hadamard};
  const std::string at = std::string("mlxprog native ") + where + ": ";
  if (kv_bits != 0 && kv_bits != 4 && kv_bits != 8)
    throw std::invalid_argument(at + "kv_bits must be 0 (float caches), 4 or 8");
  if (kv_hadamard && !format.quantized())
    throw std::invalid_argument(at + "kv_hadamard is a quantized cache's setting");
  if (format.quantized() && kv_group_size != 32 && kv_group_size != 64 && kv_group_size != 128)
    throw std::invalid_argument(at + "kv_group_size must be 32, 64 or 128");
  if (caches.size() != format.arrays())
    throw std::invalid_argument(at + (format.quantized()
                                          ? "a quantized cache is six arrays"
                                          : "a float cache is two arrays, k and v"));
  for (size_t i = 0; i < caches.size(); ++i) {
    const bool codes = format.quantized() && i % 3 == 0;
    if (caches[i].ndim() != 4 || caches[i].dtype() != (codes ? mx::uint32 : mx::float32))
      throw std::invalid_argument(at + "cache arrays are [B, H_kv, S, ...], float32 (codes: "
                                  "uint32)");
  }
  return format;
}

// Check a quantized cache's float window (`ring`: k_recent, v_recent [B,
// H_kv, R, D] float32 and recent_slots [B, R] int32, R >= 1) against the
// cache whose first array is `k`; `where` names the caller.
void check_recent(const std::vector<mx::array>& ring, const mx::array& k,
                  const CacheFormat& format, const char* where) {
  const std::string at = std::string("mlxprog native ") + where + ": ";
  if (!format.quantized())
    throw std::invalid_argument(at + "a float window of recent tokens needs a quantized cache");
  if (ring.size() != 3)
    throw std::invalid_argument(at + "the float window is three arrays: k_recent, v_recent, "
                                "recent_slots");
  const int R = ring[0].ndim() == 4 ? ring[0].shape(2) : 0;
  const mx::Shape rows = {k.shape(0), k.shape(1), R, static_cast<int>(cache_head_dim(k, format))};
  if (R < 1 || ring[0].shape() != rows || ring[1].shape() != rows ||
      ring[0].dtype() != mx::float32 || ring[1].dtype() != mx::float32)
    throw std::invalid_argument(at + "k_recent and v_recent must be float32 [B, H_kv, R, D] "
                                "of the cache's B, H_kv and D, R >= 1");
  if (ring[2].shape() != mx::Shape{k.shape(0), R} || ring[2].dtype() != mx::int32)
    throw std::invalid_argument(at + "recent_slots must be int32 [B, R]");
}

mx::array cache_attention(const mx::array& q, const std::vector<mx::array>& caches,
                          const mx::array& start, std::optional<mx::array> key_mask,
                          float scale, int64_t window, float softcap, int kv_bits,
                          int kv_group_size, bool kv_hadamard,
                          std::optional<std::vector<mx::array>> recent) {
  if (window < 0 || !(softcap >= 0.f))
    throw std::invalid_argument("cache_attention: window and softcap must be >= 0 (0: none)");
  const CacheFormat format = cache_format(caches, kv_bits, kv_group_size, kv_hadamard,
                                          "cache_attention");
  std::vector<mx::array> inputs = {q};
  inputs.insert(inputs.end(), caches.begin(), caches.end());
  inputs.push_back(start);
  if (key_mask) inputs.push_back(*key_mask);
  if (recent) {
    if (recent->size() != 5)
      throw std::invalid_argument("mlxprog native cache_attention: recent is k_recent, "
                                  "v_recent, recent_slots, new_k, new_v");
    check_recent({(*recent)[0], (*recent)[1], (*recent)[2]}, caches[0], format,
                 "cache_attention");
    const mx::array& k = (*recent)[0];
    const mx::Shape rows = {k.shape(0), k.shape(1), q.ndim() == 4 ? q.shape(2) : 0, k.shape(3)};
    for (size_t i = 3; i < 5; ++i)
      if ((*recent)[i].shape() != rows || (*recent)[i].dtype() != mx::float32)
        throw std::invalid_argument("mlxprog native cache_attention: new_k and new_v must be "
                                    "float32 [B, H_kv, T, D]");
    inputs.insert(inputs.end(), recent->begin(), recent->end());
  }
  return mx::array(q.shape(), mx::float32,
                   std::make_shared<CacheAttention>(mx::default_stream(mx::Device::cpu), scale,
                                                    key_mask.has_value(), window, softcap,
                                                    format, recent.has_value()),
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
//
// MLX's CPU eval keeps every node's input and output buffers alive until
// the node's task has run. A decode loop dispatches step n + 1 while step n
// still runs, so when a node of step n + 1 is dispatched, the cache it takes
// over is often still held by step n's pending tasks, and nothing else: the
// array is the node's alone (its descriptor's references) and the buffer
// its own. Then waiting for `stream` (once a step: by the next layer, step
// n's tasks are done) lets the cache be updated in place instead of copied,
// a copy of every layer's cache every step otherwise.
bool share_or_allocate(const mx::array& in, mx::array& out, size_t outputs,
                       const mx::Stream& stream) {
  const auto& data = in.data_shared_ptr();
  if (descriptor_references(in) == static_cast<long>(outputs) && data && data->is_owned() &&
      in.flags().row_contiguous && data.use_count() > 1)
    mx::synchronize(stream);
  if (donatable_input(in, outputs)) {
    out.copy_shared_buffer(in);
    return true;
  }
  out.set_data(mx::allocator::malloc(out.nbytes()));
  return false;
}

// A llama-style attention block's sizes and settings (see
// run_attention_block).
struct AttentionBlock {
  int64_t B, T, H, H_kv, S, D;
  int64_t start;                // the clamped cache slot of token 0
  const int32_t* positions;     // RoPE position of token 0, one or per row
  int64_t n_positions;
  const float* inv_freqs;       // rope_inv_freqs
  int dims;
  bool traditional;
  float scale;
  const uint8_t* key_mask;      // B x S, or null
  CacheFormat format;
  int64_t R;                    // a quantized cache's float window (RecentRows); 0: none
};

// Write the T new keys or values [B, H_kv, T, D] (in the cache's basis) into
// cache array(s) `cache` (set_cache's order: k or v, or its codes, scales,
// biases) at slots start..start + T - 1.
void write_cache_rows(const AttentionBlock& c, const float* rows, void* const* cache) {
  const int64_t D = c.D, groups = c.format.quantized() ? D / c.format.kv_group_size : 0;
  for (int64_t head = 0; head < c.B * c.H_kv; ++head) {
    const float* src = rows + head * c.T * D;  // a head's T rows are adjacent, in the cache too
    const int64_t slot = head * c.S + c.start;
    if (!c.format.quantized()) {
      std::memcpy(static_cast<float*>(cache[0]) + slot * D, src, c.T * D * sizeof(float));
      continue;
    }
    quantize_rows(src, c.T, D, c.format.kv_bits, c.format.kv_group_size,
                  static_cast<uint8_t*>(cache[0]) + slot * D * c.format.kv_bits / 8,
                  static_cast<float*>(cache[1]) + slot * groups,
                  static_cast<float*>(cache[2]) + slot * groups);
  }
}

// The float window after the step (`ring`: k_recent, v_recent, recent_slots,
// holding the step's input window), row by row: of the R slots up to the
// row's last new token that key_mask keeps (all T without a mask), each new
// one (s >= start) that the mask keeps goes into entry s % R, its key and
// value rows (new_k, new_v [B, H_kv, T, D], in the cache's basis) and s;
// without a mask, the step's last min(T, R) tokens. Masked tokens (a
// right-padded prompt's padding) never go in.
void update_recent(const AttentionBlock& c, const float* new_k, const float* new_v,
                   void* const* ring) {
  const int64_t R = c.R, D = c.D;
  for (int64_t b = 0; b < c.B; ++b) {
    const uint8_t* kept = c.key_mask ? c.key_mask + b * c.S : nullptr;
    int64_t last = c.start + c.T - 1;
    while (kept && last >= c.start && !kept[last]) --last;
    for (int64_t slot = std::max(c.start, last - R + 1); slot <= last; ++slot) {
      if (kept && !kept[slot]) continue;
      static_cast<int32_t*>(ring[2])[b * R + slot % R] = static_cast<int32_t>(slot);
      for (int64_t head = b * c.H_kv; head < (b + 1) * c.H_kv; ++head) {
        const int64_t from = (head * c.T + slot - c.start) * D, to = (head * R + slot % R) * D;
        std::memcpy(static_cast<float*>(ring[0]) + to, new_k + from, D * sizeof(float));
        std::memcpy(static_cast<float*>(ring[1]) + to, new_v + from, D * sizeof(float));
      }
    }
  }
}

// From the fused projection qkv [B, T, (H + 2 H_kv) D]: q and k heads
// rotated, k and v written into the cache (`cache`: its arrays in set_cache's
// order, already holding the old entries; with a float window (c.R > 0) then
// k_recent, v_recent and recent_slots, holding the input window, which the
// attention reads and update_recent then updates) at slot start, attention
// into out [B, T, H D].
void run_attention_block(const AttentionBlock& c, const float* x, void* const* cache,
                         float* out) {
  const int64_t B = c.B, T = c.T, H = c.H, H_kv = c.H_kv, D = c.D;
  const int64_t F = (H + 2 * H_kv) * D;
  // Heads out of the token-major projection: q [B, H, T, D] and the new keys
  // and values [B, H_kv, T, D]; q and k are rotated in place.
  std::vector<float> q(B * H * T * D), k(B * H_kv * T * D), v(B * H_kv * T * D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* row = x + (b * T + t) * F;
      for (int64_t h = 0; h < H; ++h)
        std::memcpy(&q[((b * H + h) * T + t) * D], row + h * D, D * sizeof(float));
      for (int64_t h = 0; h < H_kv; ++h) {
        std::memcpy(&k[((b * H_kv + h) * T + t) * D], row + (H + h) * D, D * sizeof(float));
        std::memcpy(&v[((b * H_kv + h) * T + t) * D], row + (H + H_kv + h) * D,
                    D * sizeof(float));
      }
    }
  const Kernels& kernels = *active_kernels;
  for (const std::pair<float*, int64_t>& heads :
       {std::pair<float*, int64_t>{q.data(), H}, std::pair<float*, int64_t>{k.data(), H_kv}}) {
    RopeProblem r{};
    r.x = heads.first;
    r.out = heads.first;  // the kernel reads a row before it writes it
    r.dtype = DType::f32;
    r.offsets = c.positions;
    r.n_offsets = c.n_positions;
    r.inv_freqs = c.inv_freqs;
    r.B = B;
    r.H = heads.second;
    r.T = T;
    r.D = D;
    r.dims = c.dims;
    r.traditional = c.traditional;
    const int64_t rows = B * heads.second * T;
    ThreadPool::instance().parallel_for(rows, grain_for(rows, 2, 8, 256),
                                        [&](int64_t r0, int64_t r1) { kernels.rope(r, r0, r1); });
  }
  // The new keys and values in the cache's basis, as the cache quantizes
  // them and the float window holds them.
  if (c.format.hadamard)
    for (float* rows : {k.data(), v.data()})
      kernels.hadamard(rows, B * H_kv * T * D, c.format.kv_group_size);
  const size_t half = c.format.arrays() / 2;  // the values' arrays follow the keys'
  write_cache_rows(c, k.data(), cache);
  write_cache_rows(c, v.data(), cache + half);
  AttentionProblem a{};
  a.q = q.data();
  set_cache(a, c.format, cache);
  void* const* ring = cache + c.format.arrays();
  if (c.R > 0) {
    const void* recent[5] = {ring[0], ring[1], ring[2], k.data(), v.data()};
    set_recent(a, c.R, recent);
  }
  a.key_mask = c.key_mask;
  // One token: [B, H, 1, D] is already [B, 1, H D]; else a scratch in head
  // order, then tokens first.
  std::vector<float> heads_first(T == 1 ? 0 : B * H * T * D);
  a.out = T == 1 ? out : heads_first.data();
  a.B = B;
  a.H = H;
  a.T = T;
  a.D = D;
  a.H_kv = H_kv;
  a.S = c.S;
  a.start = c.start;
  a.scale = c.scale;
  run_attention(a);
  if (c.R > 0) update_recent(c, k.data(), v.data(), ring);
  if (T != 1)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t)
          std::memcpy(out + ((b * T + t) * H + h) * D, &heads_first[((b * H + h) * T + t) * D],
                      D * sizeof(float));
}

// The attributes of an attention block (a transformer layer has them too).
struct BlockSettings {
  int heads, kv_heads, dims;
  bool traditional;
  float base, rope_scale, scale;
  bool has_freqs, has_key_mask;
  CacheFormat format;
  bool has_recent;  // a quantized cache's float window (RecentRows)

  // The arrays the block carries from step to step: the cache's, then the
  // float window's k_recent, v_recent and recent_slots.
  size_t carried() const { return format.arrays() + (has_recent ? 3 : 0); }

  bool operator==(const BlockSettings& o) const {
    return heads == o.heads && kv_heads == o.kv_heads && dims == o.dims &&
           traditional == o.traditional && base == o.base && rope_scale == o.rope_scale &&
           scale == o.scale && has_freqs == o.has_freqs && has_key_mask == o.has_key_mask &&
           format == o.format && has_recent == o.has_recent;
  }
};

// The settings of an attention block (alone, or inside a transformer layer),
// its cache checked against kv_bits, kv_group_size and kv_hadamard
// (cache_format) and its float window, if any, against the cache
// (check_recent); `where` names the op.
BlockSettings block_settings(const std::vector<mx::array>& caches,
                             const std::optional<std::vector<mx::array>>& recent, int heads,
                             int kv_heads, int dims, bool traditional, float base,
                             float rope_scale, float scale, bool has_freqs, bool has_key_mask,
                             int kv_bits, int kv_group_size, bool kv_hadamard,
                             const char* where) {
  const CacheFormat format = cache_format(caches, kv_bits, kv_group_size, kv_hadamard, where);
  if (recent) check_recent(*recent, caches[0], format, where);
  return {heads,        kv_heads, dims,   traditional, base, rope_scale, scale, has_freqs,
          has_key_mask, format,   recent.has_value()};
}

// An attention block's operands after qkv: the cache's arrays (two, or six
// of a quantized cache), with a float window its three arrays (`ring`),
// start (int32, one element: the clamped cache slot of token 0), positions
// (int32, one or B: the RoPE position of token 0), then freqs [dims / 2] and
// key_mask [B, S] (bool) where the settings say; `first` is the index of
// the cache's first array.
struct BlockOperands {
  std::vector<mx::array> caches, ring;
  mx::array start, positions;
  std::optional<mx::array> freqs, key_mask;

  BlockOperands(const BlockSettings& s, const std::vector<mx::array>& inputs, size_t first)
      : caches(inputs.begin() + first, inputs.begin() + first + s.format.arrays()),
        ring(inputs.begin() + first + s.format.arrays(), inputs.begin() + first + s.carried()),
        start(inputs[first + s.carried()]),
        positions(inputs[first + s.carried() + 1]) {
    size_t next = first + s.carried() + 2;
    if (s.has_freqs) freqs = inputs[next++];
    if (s.has_key_mask) key_mask = inputs[next++];
  }
};

// Buffers that an AttentionBlock's pointers may point into.
struct BlockScratch {
  std::vector<uint8_t> start, positions, freqs, key_mask;
  std::vector<std::vector<uint8_t>> caches;
  std::vector<float> inv_freqs;
};

// Give each carried output (outputs[1..]: the cache's arrays, then the float
// window's) the input's buffer where it may be donated (see
// share_or_allocate); which ones were shared.
std::vector<bool> share_caches(const std::vector<mx::array>& inputs, size_t first,
                               std::vector<mx::array>& outputs, const mx::Stream& stream) {
  std::vector<bool> shared(outputs.size() - 1);
  for (size_t i = 0; i < shared.size(); ++i)
    shared[i] = share_or_allocate(inputs[first + i], outputs[1 + i], outputs.size(), stream);
  return shared;
}

// The outputs' carried arrays (`cache_out`: the cache's, then the float
// window's), filled with the old ones where their buffers were not donated
// (`shared`), and the block's sizes and settings for T tokens.
AttentionBlock prepare_block(const BlockSettings& s, const BlockOperands& in, int64_t T,
                             const std::vector<bool>& shared, std::vector<mx::array>& cache_out,
                             BlockScratch& scratch) {
  std::vector<mx::array> carried = in.caches;
  carried.insert(carried.end(), in.ring.begin(), in.ring.end());
  scratch.caches.resize(carried.size());
  for (size_t i = 0; i < carried.size(); ++i)
    if (!shared[i])
      std::memcpy(cache_out[i].data<void>(), contiguous_data(carried[i], scratch.caches[i]),
                  cache_out[i].nbytes());
  scratch.inv_freqs = rope_inv_freqs(s.dims, s.base, s.rope_scale, in.freqs, scratch.freqs);
  const mx::array& k_cache = in.caches[0];
  AttentionBlock block{};
  block.B = k_cache.shape(0);
  block.T = T;
  block.H = s.heads;
  block.H_kv = s.kv_heads;
  block.S = k_cache.shape(2);
  block.D = cache_head_dim(k_cache, s.format);
  block.start = *static_cast<const int32_t*>(contiguous_data(in.start, scratch.start));
  block.positions = static_cast<const int32_t*>(contiguous_data(in.positions, scratch.positions));
  block.n_positions = static_cast<int64_t>(in.positions.size());
  block.inv_freqs = scratch.inv_freqs.data();
  block.dims = s.dims;
  block.traditional = s.traditional;
  block.scale = s.scale;
  block.key_mask = in.key_mask ? static_cast<const uint8_t*>(
                                     contiguous_data(*in.key_mask, scratch.key_mask))
                               : nullptr;
  block.format = s.format;
  block.R = in.ring.empty() ? 0 : in.ring[0].shape(2);
  return block;
}

// The writable data of the output caches, in set_cache's order, then of the
// float window's arrays.
std::vector<void*> cache_pointers(std::vector<mx::array>& cache_out) {
  std::vector<void*> pointers;
  for (mx::array& a : cache_out) pointers.push_back(a.data<void>());
  return pointers;
}

// Weak copies of outputs[1..] (the carried arrays), for a task that fills them.
std::vector<mx::array> weak_caches(std::vector<mx::array>& outputs) {
  std::vector<mx::array> caches;
  for (size_t i = 1; i < outputs.size(); ++i)
    caches.push_back(mx::array::unsafe_weak_copy(outputs[i]));
  return caches;
}

// `inputs` followed by the BlockOperands (`carried`: the cache's arrays,
// then the float window's).
std::vector<mx::array> block_inputs(std::vector<mx::array> inputs,
                                    const std::vector<mx::array>& carried,
                                    const mx::array& start, const mx::array& positions,
                                    const std::optional<mx::array>& freqs,
                                    const std::optional<mx::array>& key_mask) {
  inputs.insert(inputs.end(), carried.begin(), carried.end());
  inputs.push_back(start);
  inputs.push_back(positions);
  if (freqs) inputs.push_back(*freqs);
  if (key_mask) inputs.push_back(*key_mask);
  return inputs;
}

// The arrays a block carries: the cache's, then its float window's, if any.
std::vector<mx::array> carried_arrays(const std::vector<mx::array>& caches,
                                      const std::optional<std::vector<mx::array>>& recent) {
  std::vector<mx::array> carried = caches;
  if (recent) carried.insert(carried.end(), recent->begin(), recent->end());
  return carried;
}

// The shapes and dtypes of a block's outputs: `first` (the attention's or
// the layer's), then the carried arrays as they came in.
std::vector<mx::array> make_block_outputs(const mx::Shape& first,
                                          const std::vector<mx::array>& carried,
                                          std::shared_ptr<mx::Primitive> primitive,
                                          std::vector<mx::array> inputs) {
  std::vector<mx::Shape> shapes = {first};
  std::vector<mx::Dtype> dtypes = {mx::float32};
  for (const mx::array& c : carried) {
    shapes.push_back(c.shape());
    dtypes.push_back(c.dtype());
  }
  return mx::array::make_arrays(std::move(shapes), dtypes, std::move(primitive),
                                std::move(inputs));
}

class CacheAttentionBlock : public mx::Primitive {
 public:
  CacheAttentionBlock(mx::Stream stream, const BlockSettings& settings)
      : mx::Primitive(stream), settings_(settings) {}

  // inputs: qkv [B, T, (H + 2 H_kv) D] (float32), then the BlockOperands.
  // outputs: attention [B, T, H D], then the new cache arrays (and float
  // window's).
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const std::vector<bool> shared = share_caches(inputs, 1, outputs, stream());
    outputs[0].set_data(mx::allocator::malloc(outputs[0].nbytes()));
    mx::cpu::get_command_encoder(stream()).dispatch(
        [qkv = inputs[0], operands = BlockOperands(settings_, inputs, 1), shared,
         out = mx::array::unsafe_weak_copy(outputs[0]), cache_out = weak_caches(outputs),
         settings = settings_]() mutable {
          BlockScratch scratch;
          std::vector<uint8_t> keep_x;
          const AttentionBlock block = prepare_block(settings, operands, qkv.shape(1), shared,
                                                     cache_out, scratch);
          run_attention_block(block, static_cast<const float*>(contiguous_data(qkv, keep_x)),
                              cache_pointers(cache_out).data(), out.data<float>());
        });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error(
        "MlxprogCacheAttentionBlock (an mlxprog native kernel) runs on the CPU only");
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const mx::Shape& x = inputs[0].shape();
    std::vector<mx::Shape> shapes = {
        {x[0], x[1], settings_.heads * static_cast<int>(cache_head_dim(inputs[1],
                                                                        settings_.format))}};
    for (size_t i = 0; i < settings_.carried(); ++i) shapes.push_back(inputs[1 + i].shape());
    return shapes;
  }

  const char* name() const override { return "MlxprogCacheAttentionBlock"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const CacheAttentionBlock*>(&other);
    return o && o->settings_ == settings_;
  }

 private:
  BlockSettings settings_;
};

std::vector<mx::array> cache_attention_block(const mx::array& qkv,
                                             const std::vector<mx::array>& caches,
                                             const mx::array& start, const mx::array& positions,
                                             int heads, int kv_heads, int dims, bool traditional,
                                             float base, float rope_scale, float scale,
                                             std::optional<mx::array> freqs,
                                             std::optional<mx::array> key_mask, int kv_bits,
                                             int kv_group_size, bool kv_hadamard,
                                             std::optional<std::vector<mx::array>> recent) {
  const BlockSettings settings =
      block_settings(caches, recent, heads, kv_heads, dims, traditional, base, rope_scale,
                     scale, freqs.has_value(), key_mask.has_value(), kv_bits, kv_group_size,
                     kv_hadamard, "cache_attention_block");
  const mx::Shape out_shape = {
      qkv.shape(0), qkv.shape(1),
      heads * static_cast<int>(cache_head_dim(caches[0], settings.format))};
  const std::vector<mx::array> carried = carried_arrays(caches, recent);
  return make_block_outputs(
      out_shape, carried,
      std::make_shared<CacheAttentionBlock>(mx::default_stream(mx::Device::cpu), settings),
      block_inputs({qkv}, carried, start, positions, freqs, key_mask));
}

// -- a whole transformer layer -------------------------------------------------------------
//
// A llama-style layer (pre-norm attention block and SwiGLU MLP, each added to
// the residual) as one node: the eight kernels of the separate ops run one
// after another in one task, through scratch buffers. A decode step of a
// small model is then a few dozen nodes, and the host's cost of building and
// dispatching it (microseconds per node, on a core the kernels want) shrinks
// by as much.

class TransformerLayer : public mx::Primitive {
 public:
  TransformerLayer(mx::Stream stream, const BlockSettings& block, float eps, int group_size,
                   int bits, bool int8)
      : mx::Primitive(stream), block_(block), eps_(eps), group_size_(group_size), bits_(bits),
        int8_(int8) {}

  // inputs: h [B, T, hidden] (float32), the input norm's weight [hidden],
  // the packed (w, scales, biases) of the qkv projection, then of the output
  // projection, the post-attention norm's weight, the packed gate/up
  // projection (gate, then up rows) and the down projection; then the
  // BlockOperands. outputs: the layer's h [B, T, hidden], the new cache
  // arrays (and float window's).
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const std::vector<bool> shared = share_caches(inputs, kBlock, outputs, stream());
    outputs[0].set_data(mx::allocator::malloc(outputs[0].nbytes()));
    mx::cpu::get_command_encoder(stream()).dispatch(
        [inputs, operands = BlockOperands(block_, inputs, kBlock), shared,
         h_out = mx::array::unsafe_weak_copy(outputs[0]), cache_out = weak_caches(outputs),
         block_settings = block_, eps = eps_, group_size = group_size_, bits = bits_,
         int8 = int8_]() mutable {
          BlockScratch scratch;
          const mx::array& h_in = inputs[0];
          const int64_t T = h_in.shape(1), hidden = h_in.shape(2);
          const int64_t M = h_in.shape(0) * T;
          const AttentionBlock block = prepare_block(block_settings, operands, T, shared,
                                                     cache_out, scratch);
          const int64_t F = (block.H + 2 * block.H_kv) * block.D, A = block.H * block.D;
          const int64_t G = inputs[9].shape(0), I = G / 2;  // gate/up rows, MLP width
          std::vector<std::vector<uint8_t>> keep(inputs.size());
          auto data = [&](size_t i) { return contiguous_data(inputs[i], keep[i]); };
          auto matrix = [&](size_t i) {
            return PackedMatrix{static_cast<const uint8_t*>(data(i)), data(i + 1), data(i + 2),
                                dtype_of(inputs[i + 1]), dtype_of(inputs[i + 2]), bits,
                                group_size};
          };
          float* h = h_out.data<float>();
          std::vector<float> x(M * hidden), qkv(M * F), attn(M * A), y(M * hidden), gate_up(M * G),
              mlp(M * I);
          run_rms_norm(static_cast<const float*>(data(0)), data(1), dtype_of(inputs[1]), M, hidden,
                       eps, x.data());
          run_qmm(x.data(), DType::f32, M, hidden, F, matrix(2), true, int8, qkv.data());
          run_attention_block(block, qkv.data(), cache_pointers(cache_out).data(), attn.data());
          run_qmm(attn.data(), DType::f32, M, A, hidden, matrix(5), true, int8, y.data());
          const float* h0 = static_cast<const float*>(data(0));
          for (int64_t i = 0; i < M * hidden; ++i) h[i] = h0[i] + y[i];
          run_rms_norm(h, data(8), dtype_of(inputs[8]), M, hidden, eps, x.data());
          run_qmm(x.data(), DType::f32, M, hidden, G, matrix(9), true, int8, gate_up.data());
          SwigluProblem swiglu{gate_up.data(), mlp.data(), I};
          const Kernels& kernels = *active_kernels;
          ThreadPool::instance().parallel_for(
              M, grain_for(M, 2, 1, 256),
              [&](int64_t r0, int64_t r1) { kernels.swiglu(swiglu, r0, r1); });
          run_qmm(mlp.data(), DType::f32, M, I, hidden, matrix(12), true, int8, y.data());
          for (int64_t i = 0; i < M * hidden; ++i) h[i] += y[i];
        });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error(
        "MlxprogTransformerLayer (an mlxprog native kernel) runs on the CPU only");
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    std::vector<mx::Shape> shapes = {inputs[0].shape()};
    for (size_t i = 0; i < block_.carried(); ++i) shapes.push_back(inputs[kBlock + i].shape());
    return shapes;
  }

  const char* name() const override { return "MlxprogTransformerLayer"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const TransformerLayer*>(&other);
    return o && o->block_ == block_ && o->eps_ == eps_ && o->group_size_ == group_size_ &&
           o->bits_ == bits_ && o->int8_ == int8_;
  }

  static constexpr size_t kBlock = 15;  // the index of the cache's first array among the inputs

 private:
  BlockSettings block_;
  float eps_;
  int group_size_, bits_;
  bool int8_;
};

std::vector<mx::array> transformer_layer(
    const mx::array& h, const mx::array& input_norm, const std::vector<mx::array>& qkv,
    const std::vector<mx::array>& o, const mx::array& post_norm,
    const std::vector<mx::array>& gate_up, const std::vector<mx::array>& down,
    const std::vector<mx::array>& caches, const mx::array& start, const mx::array& positions,
    int heads, int kv_heads, int dims, bool traditional, float base, float rope_scale,
    float scale, float eps, int group_size, int bits, bool int8, std::optional<mx::array> freqs,
    std::optional<mx::array> key_mask, int kv_bits, int kv_group_size, bool kv_hadamard,
    std::optional<std::vector<mx::array>> recent) {
  for (const auto* m : {&qkv, &o, &gate_up, &down})
    if (m->size() != 3 || (*m)[0].dtype() != mx::uint32 || (*m)[0].ndim() != 2)
      throw std::invalid_argument(
          "mlxprog native transformer_layer: each projection is (w uint32 [N, K], scales, "
          "biases)");
  if (h.ndim() != 3 || h.dtype() != mx::float32)
    throw std::invalid_argument(
        "mlxprog native transformer_layer: h must be a float32 [B, T, hidden]");
  if (int8 && bits != 4 && bits != 8)
    throw std::invalid_argument("mlxprog native transformer_layer: int8 numerics need 4 or 8 bits");
  const BlockSettings settings =
      block_settings(caches, recent, heads, kv_heads, dims, traditional, base, rope_scale,
                     scale, freqs.has_value(), key_mask.has_value(), kv_bits, kv_group_size,
                     kv_hadamard, "transformer_layer");
  std::vector<mx::array> inputs = {h, input_norm};
  inputs.insert(inputs.end(), qkv.begin(), qkv.end());
  inputs.insert(inputs.end(), o.begin(), o.end());
  inputs.push_back(post_norm);
  inputs.insert(inputs.end(), gate_up.begin(), gate_up.end());
  inputs.insert(inputs.end(), down.begin(), down.end());
  const std::vector<mx::array> carried = carried_arrays(caches, recent);
  return make_block_outputs(
      h.shape(), carried,
      std::make_shared<TransformerLayer>(mx::default_stream(mx::Device::cpu), settings, eps,
                                         group_size, bits, int8),
      block_inputs(std::move(inputs), carried, start, positions, freqs, key_mask));
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
  m.def("cache_attention", &mlxprog::cache_attention, nb::arg("q"), nb::arg("caches"),
        nb::arg("start"), nb::arg("key_mask").none() = nb::none(), nb::kw_only(),
        nb::arg("scale"), nb::arg("window") = 0, nb::arg("softcap") = 0.f,
        nb::arg("kv_bits") = 0, nb::arg("kv_group_size") = 0, nb::arg("kv_hadamard") = false,
        nb::arg("recent").none() = nb::none(),
        "Attention of q [B, H, T, D] over a cache: caches = [k, v] ([B, H_kv, S, D] "
        "float32), or with kv_bits 4 or 8 the codes, scales and biases of k, then of v "
        "(MLX's affine quantization in groups of kv_group_size; with kv_hadamard, of each "
        "group's Walsh-Hadamard transform, see hadamard). Query t sees key j when "
        "j <= start + t, j > start + t - window (window > 0) and key_mask[b, j]; scores "
        "capped at softcap * tanh(s / softcap) when softcap > 0; a query that sees no key "
        "gets zeros. recent (a quantized cache's float window): [k_recent, v_recent "
        "[B, H_kv, R, D] float32, recent_slots [B, R] int32, new_k, new_v [B, H_kv, T, D] "
        "float32], all in the cache's basis: query t (slot p = start + t) reads key and "
        "value j with p - j < R from new_k/new_v (j >= start) or from the ring's entry "
        "j % R when recent_slots[b, j % R] == j, else dequantized.");
  m.def("cache_attention_block", &mlxprog::cache_attention_block, nb::arg("qkv"),
        nb::arg("caches"), nb::arg("start"), nb::arg("positions"), nb::kw_only(),
        nb::arg("heads"), nb::arg("kv_heads"), nb::arg("dims"), nb::arg("traditional"),
        nb::arg("base"), nb::arg("rope_scale"), nb::arg("scale"),
        nb::arg("freqs").none() = nb::none(), nb::arg("key_mask").none() = nb::none(),
        nb::arg("kv_bits") = 0, nb::arg("kv_group_size") = 0, nb::arg("kv_hadamard") = false,
        nb::arg("recent").none() = nb::none(),
        "A fused attention block: q, k, v heads of qkv [B, T, (H + 2 H_kv) D], q and k "
        "rotated at positions[b] + t, k and v written into the cache (as cache_attention's "
        "caches; quantized as mx.quantize does) at slot start, attention as "
        "cache_attention; returns [out [B, T, H D], *caches]. recent: a quantized cache's "
        "float window [k_recent, v_recent, recent_slots] (as cache_attention's, the new "
        "rows being the block's own), read as cache_attention reads it; then, in each row, "
        "the new tokens among the R slots up to the row's last one key_mask keeps go into "
        "entry slot % R where the mask keeps them; returns [out, *caches, k_recent, "
        "v_recent, recent_slots].");
  m.def("transformer_layer", &mlxprog::transformer_layer, nb::arg("h"), nb::arg("input_norm"),
        nb::arg("qkv"), nb::arg("o"), nb::arg("post_norm"), nb::arg("gate_up"), nb::arg("down"),
        nb::arg("caches"), nb::arg("start"), nb::arg("positions"), nb::kw_only(),
        nb::arg("heads"), nb::arg("kv_heads"), nb::arg("dims"), nb::arg("traditional"),
        nb::arg("base"), nb::arg("rope_scale"), nb::arg("scale"), nb::arg("eps"),
        nb::arg("group_size"), nb::arg("bits"), nb::arg("int8") = false,
        nb::arg("freqs").none() = nb::none(), nb::arg("key_mask").none() = nb::none(),
        nb::arg("kv_bits") = 0, nb::arg("kv_group_size") = 0, nb::arg("kv_hadamard") = false,
        nb::arg("recent").none() = nb::none(),
        "A llama-style layer: x = rms_norm(h, input_norm); the attention block of "
        "qmm(x, qkv) (as cache_attention_block); h += qmm(attention, o); x = rms_norm(h, "
        "post_norm); h += qmm(swiglu_halves(qmm(x, gate_up)), down). Each projection is "
        "(w, scales, biases), transpose; returns [h, *caches], with recent (as "
        "cache_attention_block's) [h, *caches, k_recent, v_recent, recent_slots].");
  m.def("hadamard", [](const mx::array& x, int group_size) {
        // For tests: the kernels' transform against the ops' MLX form.
        if (x.dtype() != mx::float32 || x.ndim() != 2 || group_size < 1 ||
            (group_size & (group_size - 1)) || x.shape(1) % group_size != 0)
          throw std::invalid_argument("hadamard: float32 [rows, D], group_size a power of two "
                                      "dividing D");
        mx::array xc = mx::contiguous(x);
        xc.eval();
        std::vector<float> out(xc.data<float>(), xc.data<float>() + x.size());
        mlxprog::active_kernels->hadamard(out.data(), static_cast<int64_t>(out.size()),
                                          group_size);
        return mx::array(out.begin(), x.shape(), mx::float32);
      }, nb::arg("x"), nb::arg("group_size"),
      "The unnormalized Walsh-Hadamard transform of each group of group_size features of "
      "the rows of x, as the quantized caches store them (for tests).");
  m.def("quantize_rows", [](const mx::array& x, int bits, int group_size) {
        // For tests: the kernels' cache quantization against mx.quantize.
        if (x.dtype() != mx::float32 || x.ndim() != 2 || (bits != 4 && bits != 8) ||
            (group_size != 32 && group_size != 64 && group_size != 128) ||
            x.shape(1) % group_size != 0)
          throw std::invalid_argument("quantize_rows: float32 [rows, D], 4 or 8 bits, "
                                      "group_size 32, 64 or 128 dividing D");
        mx::array xc = mx::contiguous(x);
        xc.eval();
        const int rows = x.shape(0), D = x.shape(1), groups = D / group_size;
        std::vector<uint32_t> codes(static_cast<size_t>(rows) * D * bits / 32);
        std::vector<float> scales(static_cast<size_t>(rows) * groups), biases(scales.size());
        mlxprog::quantize_rows(xc.data<float>(), rows, D, bits, group_size,
                               reinterpret_cast<uint8_t*>(codes.data()), scales.data(),
                               biases.data());
        return std::vector<mx::array>{
            mx::array(codes.begin(), {rows, D * bits / 32}, mx::uint32),
            mx::array(scales.begin(), {rows, groups}, mx::float32),
            mx::array(biases.begin(), {rows, groups}, mx::float32)};
      }, nb::arg("x"), nb::arg("bits"), nb::arg("group_size"),
      "MLX's affine quantization of the rows of x as the cache kernels write it: "
      "[codes, scales, biases] (for tests against mx.quantize).");
  mlxprog::bind_gemm_conv(m);
  mlxprog::bind_window(m);
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
  mlxprog::bind_int_matmul(m);
  mlxprog::bind_quants(m, &mlxprog::active_kernels);
  m.def("threads", [] { return mlxprog::ThreadPool::instance().threads(); },
        "The kernels' thread count, the calling thread included.");
}
