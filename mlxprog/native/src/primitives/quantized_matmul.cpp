// The quantized matmul primitive (MLX's affine format; the kernels:
// kernels/*/qmm.h) and its Python function, quantized_matmul.
#include "primitives/quantized_matmul.h"

#include <memory>
#include <stdexcept>
#include <vector>

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

}  // namespace

void bind_quantized_matmul(nb::module_& m) {
  m.def("quantized_matmul", &quantized_matmul, nb::arg("x"), nb::arg("w"),
        nb::arg("scales"), nb::arg("biases"), nb::kw_only(), nb::arg("transpose"),
        nb::arg("group_size"), nb::arg("bits"), nb::arg("int8") = false,
        "x @ dequantize(w).T (transpose) or x @ dequantize(w), MLX's affine format; "
        "int8: x quantized to int8 per group and integer dot products (transpose, 4 or 8 "
        "bits).");
}

}  // namespace mlxprog
