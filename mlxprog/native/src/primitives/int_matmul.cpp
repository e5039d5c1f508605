// The exact integer matmul as an MLX primitive (its driver:
// int_matmul_driver.h, on the kernel table's micro-kernels) and its Python
// function, integer_matmul.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nanobind/stl/string.h>

#include "primitive.h"
#include "primitives/int_matmul_driver.h"

namespace mlxprog {
namespace {

// The broadcast batch shape of a [..., M, K] and b [..., K, N] followed by
// (M, N); invalid_argument where the operands do not fit.
mx::Shape product_shape(const mx::array& a, const mx::array& b) {
  if (a.ndim() < 2 || b.ndim() < 2 || a.shape(-1) != b.shape(-2))
    throw std::invalid_argument(
        "mlxprog native integer_matmul: operands must be [..., M, K] and [..., K, N]");
  const int a_batch = static_cast<int>(a.ndim()) - 2, b_batch = static_cast<int>(b.ndim()) - 2;
  const int nd = std::max(a_batch, b_batch);
  mx::Shape shape(nd + 2);
  for (int d = 0; d < nd; ++d) {
    // Batch axes pair from the right; a missing axis has size 1.
    const int da = d - (nd - a_batch), db = d - (nd - b_batch);
    const int sa = da >= 0 ? a.shape(da) : 1, sb = db >= 0 ? b.shape(db) : 1;
    if (sa != sb && sa != 1 && sb != 1)
      throw std::invalid_argument("mlxprog native integer_matmul: batch axes do not broadcast");
    shape[d] = sa == 1 ? sb : sa;
  }
  shape[nd] = a.shape(-2);
  shape[nd + 1] = b.shape(-1);
  return shape;
}

// Element offsets of x's matrices, one per element of the batch shape of
// `out` in row-major order (x's batch axes broadcast against it: a missing
// or size-1 axis repeats).
std::vector<int64_t> batch_offsets(const mx::array& x, const mx::Shape& out) {
  const int nd = static_cast<int>(out.size()) - 2, x_batch = static_cast<int>(x.ndim()) - 2;
  std::vector<int64_t> strides(nd, 0);
  int64_t count = 1;
  for (int d = 0; d < nd; ++d) {
    count *= out[d];
    const int dx = d - (nd - x_batch);
    if (dx >= 0 && x.shape(dx) != 1) strides[d] = x.strides()[dx];
  }
  std::vector<int64_t> offsets(count);
  std::vector<int64_t> index(nd, 0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t offset = 0;
    for (int d = 0; d < nd; ++d) offset += index[d] * strides[d];
    offsets[i] = offset;
    for (int d = nd - 1; d >= 0; --d) {
      if (++index[d] < out[d]) break;
      index[d] = 0;
    }
  }
  return offsets;
}

template <class T>
void compute(const mx::array& a, const mx::array& b, mx::array& out,
             const IntMatmulTiles& tiles) {
  const std::vector<int64_t> a_offsets = batch_offsets(a, out.shape());
  const std::vector<int64_t> b_offsets = batch_offsets(b, out.shape());
  const size_t na = a.ndim(), nb_ = b.ndim();
  int_kernels::Operands<T> p{};
  p.a = a.data<T>();
  p.b = b.data<T>();
  p.c = out.data<T>();
  p.a_offsets = a_offsets.data();
  p.b_offsets = b_offsets.data();
  p.batch = static_cast<int64_t>(a_offsets.size());
  p.M = a.shape(-2);
  p.K = a.shape(-1);
  p.N = b.shape(-1);
  p.a_rs = a.strides()[na - 2];
  p.a_cs = a.strides()[na - 1];
  p.b_rs = b.strides()[nb_ - 2];
  p.b_cs = b.strides()[nb_ - 1];
  // One B for the whole batch and A's matrices stacked at its row stride (a
  // contiguous [..., M, K] @ [K, N], an ONNX MatMulInteger on activations):
  // one product of batch * M rows, so B is packed once and a few rows per
  // matrix still fill whole tiles. C's matrices stack the same way. A
  // one-row A's row stride is never read, so it may be the batch's step.
  if (p.M == 1 && p.batch > 1) p.a_rs = a_offsets[1] - a_offsets[0];
  bool stacked = p.batch > 1;
  for (int64_t i = 1; stacked && i < p.batch; ++i)
    stacked = b_offsets[i] == b_offsets[0] && a_offsets[i] == a_offsets[0] + i * p.M * p.a_rs;
  if (stacked) {
    p.M *= p.batch;
    p.batch = 1;
  }
  int_kernels::run(p, tiles);
}

// Reads its operands through their strides (transposed and broadcast views
// need no copy).
class IntegerMatmul : public mx::UnaryPrimitive {
 public:
  // tiles: the micro-kernels of a kernel table the CPU runs.
  IntegerMatmul(mx::Stream stream, const IntMatmulTiles* tiles)
      : mx::UnaryPrimitive(stream), tiles_(tiles) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    // Input data is read in the task, once earlier tasks have produced it;
    // the task holds `out` weakly, as MLX's own primitives do.
    mx::cpu::get_command_encoder(stream()).dispatch(
        [a = inputs[0], b = inputs[1], out = mx::array::unsafe_weak_copy(out),
         tiles = tiles_]() mutable {
          switch (out.dtype()) {
            case mx::int8: return compute<int8_t>(a, b, out, *tiles);
            case mx::int16: return compute<int16_t>(a, b, out, *tiles);
            case mx::int32: return compute<int32_t>(a, b, out, *tiles);
            case mx::int64: return compute<int64_t>(a, b, out, *tiles);
            case mx::uint8: return compute<uint8_t>(a, b, out, *tiles);
            case mx::uint16: return compute<uint16_t>(a, b, out, *tiles);
            case mx::uint32: return compute<uint32_t>(a, b, out, *tiles);
            case mx::uint64: return compute<uint64_t>(a, b, out, *tiles);
            default:
              throw std::invalid_argument("mlxprog native integer_matmul: not an integer dtype");
          }
        });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error(
        "MlxprogIntegerMatmul (an mlxprog native kernel) runs on the CPU only");
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {product_shape(inputs[0], inputs[1])};
  }

  const char* name() const override { return "MlxprogIntegerMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const IntegerMatmul*>(&other);
    return o && o->tiles_ == tiles_;
  }

 private:
  const IntMatmulTiles* tiles_;
};

bool is_integer(mx::Dtype t) {
  return t == mx::int8 || t == mx::int16 || t == mx::int32 || t == mx::int64 ||
         t == mx::uint8 || t == mx::uint16 || t == mx::uint32 || t == mx::uint64;
}

mx::array integer_matmul(const mx::array& a, const mx::array& b, const std::string& isa) {
  if (a.dtype() != b.dtype() || !is_integer(a.dtype()))
    throw std::invalid_argument(
        "mlxprog native integer_matmul: operands must share one integer dtype");
  const Kernels* table = isa.empty() ? &select_kernels() : kernels_named(isa.c_str());
  if (!table) throw std::invalid_argument("no kernel table '" + isa + "' usable here");
  return mx::array(product_shape(a, b), a.dtype(),
                   std::make_shared<IntegerMatmul>(mx::default_stream(mx::Device::cpu),
                                                   &table->int_matmul),
                   {a, b});
}

}  // namespace

void bind_int_matmul(nb::module_& m) {
  m.def("integer_matmul", &integer_matmul, nb::arg("a"), nb::arg("b"), nb::kw_only(),
        nb::arg("isa") = std::string(),
        "a [..., M, K] @ b [..., K, N] (batch axes broadcast) for operands of one integer "
        "dtype, exact modulo 2**bits (wrapping like numpy); isa: the kernel table whose "
        "vector code to use (see isas(); default: MLXPROG_NATIVE_ISA, else the best).");
}

}  // namespace mlxprog
