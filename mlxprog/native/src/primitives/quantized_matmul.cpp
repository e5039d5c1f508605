// The quantized matmul primitives (MLX's affine format; the kernels:
// kernels/*/qmm.h) and their Python functions: quantized_matmul, and
// gather_quantized_matmul (each slot's expert of a stack of them).
#include "primitives/quantized_matmul.h"

#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "primitives/expert_slots.h"
#include "primitives/panel_gemm.h"
#include "threadpool.h"

namespace mlxprog {
namespace {

// Element i of a scales or biases array.
float load_scalar(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::f16:
      return half_to_float(static_cast<const uint16_t*>(p)[i]);
    default:
      return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
}

// Row n of m (stored N x K, transposed use) dequantized in element order:
// scale * code + bias, each group's codes a little-endian bit stream.
void dequantize_affine_row(const PackedMatrix& m, int64_t K, int64_t n, float* dst) {
  const int64_t groups = K / m.group_size, row_bytes = K * m.bits / 8;
  const uint8_t* codes = m.w + n * row_bytes;
  for (int64_t g = 0; g < groups; ++g) {
    const float scale = load_scalar(m.scales, m.scales_dtype, n * groups + g);
    const float bias = load_scalar(m.biases, m.biases_dtype, n * groups + g);
    float* out = dst + g * m.group_size;
    const uint8_t* src = codes + g * m.group_size * m.bits / 8;
    if (m.bits == 8) {
      for (int i = 0; i < m.group_size; ++i) out[i] = scale * static_cast<float>(src[i]) + bias;
    } else if (m.bits == 4) {
      for (int i = 0; i < m.group_size / 2; ++i) {
        out[2 * i] = scale * static_cast<float>(src[i] & 0x0F) + bias;
        out[2 * i + 1] = scale * static_cast<float>(src[i] >> 4) + bias;
      }
    } else {
      uint64_t acc = 0;
      int have = 0;
      const uint32_t mask = (1u << m.bits) - 1;
      for (int i = 0; i < m.group_size; ++i) {
        while (have < m.bits) {
          acc |= static_cast<uint64_t>(*src++) << have;
          have += 8;
        }
        out[i] = scale * static_cast<float>(acc & mask) + bias;
        acc >>= m.bits;
        have -= m.bits;
      }
    }
  }
}

}  // namespace

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
  if (transpose && M >= kPanelGemmMinRows) {
    for (int64_t i = 0; i < M * K; ++i) xp[i] = load_scalar(x, x_dtype, i);
    panel_gemm(kernels, xp.data(), M, K, N,
               [&](int64_t n, float* dst) { dequantize_affine_row(m, K, n, dst); }, out, N);
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

namespace {

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

class QuantizedMatmul : public CpuPrimitive {
 public:
  // `int8`: the int8 numerics (kernels/portable/qmm.h; 4- and 8-bit codes,
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

// Byte size of one element of a scales or biases array.
int64_t scalar_bytes(DType t) { return t == DType::f32 ? 4 : 2; }

// out [..., k, N] float32: each slot of indices [..., k] times its expert of
// w uint32 [E, N, K * bits / 32] with scales and biases [E, N, K /
// group_size], x [..., K] (one row per token) or, per_slot, [..., k, K];
// int8: the int8 numerics (4- or 8-bit codes). Each chosen expert runs
// run_qmm once on the rows of all its slots (ExpertSlots); the other experts
// are not read.
class GatherQuantizedMatmul : public CpuPrimitive {
 public:
  GatherQuantizedMatmul(mx::Stream stream, int group_size, int bits, bool per_slot, bool int8)
      : CpuPrimitive(stream), group_size_(group_size), bits_(bits), per_slot_(per_slot),
        int8_(int8) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    enqueue(out, [x = inputs[0], w = inputs[1], scales = inputs[2], biases = inputs[3],
                  indices = inputs[4], group_size = group_size_, bits = bits_,
                  per_slot = per_slot_, int8 = int8_](mx::array& out) {
      std::vector<uint8_t> keep_x, keep_w, keep_s, keep_b;
      const int64_t K = x.shape(-1), N = w.shape(1), groups = K / group_size;
      const ExpertSlots slots(indices, w.shape(0));
      const DType x_dtype = dtype_of(x);
      const int64_t x_bytes = x.itemsize();
      const uint8_t* x_rows = static_cast<const uint8_t*>(contiguous_data(x, keep_x));
      const PackedMatrix all =
          packed_matrix(w, scales, biases, bits, group_size, keep_w, keep_s, keep_b);
      float* y = out.data<float>();
      auto run_expert = [&](int64_t e) {
        const int64_t count = slots.count(e);
        std::vector<uint8_t> gathered(count * K * x_bytes);
        std::vector<float> product(count * N);
        for (int64_t i = 0; i < count; ++i)
          std::memcpy(gathered.data() + i * K * x_bytes,
                      x_rows + slots.rows(e, i, per_slot).first * K * x_bytes, K * x_bytes);
        PackedMatrix m = all;
        m.w += e * N * K * bits / 8;
        m.scales = static_cast<const uint8_t*>(all.scales) +
                   e * N * groups * scalar_bytes(all.scales_dtype);
        m.biases = static_cast<const uint8_t*>(all.biases) +
                   e * N * groups * scalar_bytes(all.biases_dtype);
        run_qmm(gathered.data(), x_dtype, count, K, N, m, true, int8, product.data());
        for (int64_t i = 0; i < count; ++i)
          std::memcpy(y + slots.rows(e, i, per_slot).second * N, product.data() + i * N,
                      N * sizeof(float));
      };
      const std::vector<int64_t>& chosen = slots.chosen();
      const int64_t experts = static_cast<int64_t>(chosen.size());
      ThreadPool& pool = ThreadPool::instance();
      // Enough experts for every thread: one expert per job (run_qmm then
      // runs on its thread); else one after another, each on the whole pool.
      if (experts >= pool.threads()) {
        pool.parallel_for(experts, 1, [&](int64_t j0, int64_t j1) {
          for (int64_t j = j0; j < j1; ++j) run_expert(chosen[j]);
        });
      } else {
        for (int64_t e : chosen) run_expert(e);
      }
    });
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape shape = inputs[4].shape();
    shape.push_back(inputs[1].shape(1));
    return {shape};
  }

  const char* name() const override { return "MlxprogGatherQuantizedMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const GatherQuantizedMatmul*>(&other);
    return o && group_size_ == o->group_size_ && bits_ == o->bits_ &&
           per_slot_ == o->per_slot_ && int8_ == o->int8_;
  }

 private:
  int group_size_, bits_;
  bool per_slot_, int8_;
};

mx::array gather_quantized_matmul(const mx::array& x, const mx::array& w,
                                  const mx::array& scales, const mx::array& biases,
                                  const mx::array& indices, int group_size, int bits,
                                  bool per_slot, bool int8) {
  const int K = x.ndim() ? x.shape(-1) : 0;
  const bool int8_bits = bits == 4 || bits == 8, any_bits = bits >= 1 && bits <= 8 && bits != 7;
  bool fits = w.ndim() == 3 && w.dtype() == mx::uint32 && (int8 ? int8_bits : any_bits) &&
              w.shape(0) > 0 && K > 0 && K % group_size == 0 && w.shape(2) * 32 / bits == K;
  fits = fits && scales.shape() == mx::Shape{w.shape(0), w.shape(1), K / group_size} &&
         biases.shape() == scales.shape() && indices.ndim() >= 1 &&
         mx::issubdtype(indices.dtype(), mx::integer) &&
         x.ndim() == indices.ndim() + (per_slot ? 1 : 0);
  for (int d = 0; fits && d < indices.ndim() - (per_slot ? 0 : 1); ++d)
    fits = x.shape(d) == indices.shape(d);
  if (!fits)
    throw std::invalid_argument(
        "mlxprog native gather_quantized_matmul: needs x [..., K] (per slot [..., k, K]), w "
        "uint32 [E, N, K * bits / 32] (int8: 4- or 8-bit codes), scales and biases [E, N, K / "
        "group_size] and integer indices [..., k]");
  mx::Shape shape = indices.shape();
  shape.push_back(w.shape(1));
  return mx::array(shape, mx::float32,
                   std::make_shared<GatherQuantizedMatmul>(mx::default_stream(mx::Device::cpu),
                                                           group_size, bits, per_slot, int8),
                   {x, w, scales, biases, indices});
}

}  // namespace

void bind_quantized_matmul(nb::module_& m) {
  m.def("quantized_matmul", &quantized_matmul, nb::arg("x"), nb::arg("w"),
        nb::arg("scales"), nb::arg("biases"), nb::kw_only(), nb::arg("transpose"),
        nb::arg("group_size"), nb::arg("bits"), nb::arg("int8") = false,
        "x @ dequantize(w).T (transpose) or x @ dequantize(w), MLX's affine format; "
        "int8: x quantized to int8 per group and integer dot products (transpose, 4 or 8 "
        "bits).");
  m.def("gather_quantized_matmul", &gather_quantized_matmul, nb::arg("x"), nb::arg("w"),
        nb::arg("scales"), nb::arg("biases"), nb::arg("indices"), nb::kw_only(),
        nb::arg("group_size"), nb::arg("bits"), nb::arg("per_slot") = false,
        nb::arg("int8") = false,
        "For each slot of indices [..., k]: x [..., K] (per_slot: [..., k, K]) @ "
        "dequantize(w[e]).T as float32 [..., k, N], MLX's affine experts w [E, N, K * bits / "
        "32]; int8: the int8 numerics (4- or 8-bit codes). Reads only the chosen experts, each "
        "once for all its slots.");
}

}  // namespace mlxprog
