// GGML's block-quantized weights (GGUF's) as MLX primitives: ggml_matmul
// (x @ w.T with w a GGML type's rows of blocks) and ggml_dequantize (rows of
// blocks to float32), on the per-type kernels of quants/ and the thread
// pool; and their Python functions, with set_codebook and ggml_types.
#include "primitives/ggml_matmul.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "primitives/panel_gemm.h"
#include "threadpool.h"

namespace mlxprog {
namespace {

// Weight rows one chunk of a job takes together: their blocks stay in L1
// while every row of x passes over them.
constexpr int64_t kRowsPerTile = 16;

// The rows of a float32, float16 or bfloat16 array as dense float32: its
// own data, or converted (and gathered) into `keep`.
const float* float_rows(const mx::array& x, std::vector<float>& keep) {
  std::vector<uint8_t> gathered;
  const void* data = contiguous_data(x, gathered);
  if (x.dtype() == mx::float32 && gathered.empty()) return static_cast<const float*>(data);
  keep.resize(x.size());
  if (x.dtype() == mx::float32) {
    std::memcpy(keep.data(), data, x.nbytes());
    return keep.data();
  }
  const uint16_t* src = static_cast<const uint16_t*>(data);
  const bool half = x.dtype() == mx::float16;
  for (size_t i = 0; i < x.size(); ++i) keep[i] = half ? half_to_float(src[i]) : bf16_to_float(src[i]);
  return keep.data();
}

// How far ahead of the row being multiplied the weight rows are prefetched.
constexpr int64_t kPrefetchRows = 8;

// Ask for the cache lines of one weight row (`bytes` from `row`, cut at
// `end`) ahead of its use.
inline void prefetch_rows(const uint8_t* row, int64_t bytes, const uint8_t* end) {
  const uint8_t* stop = row + bytes < end ? row + bytes : end;
  for (const uint8_t* p = row; p < stop; p += 64) __builtin_prefetch(p, 0, 3);
}

// The type's kernels in the quant table of kernel table `isa`.
quants::TypeKernels type_kernels(const quants::QuantKernels& table, int type) {
  quants::TypeKernels k{};
  if (!quants::resolve(table, type, k) || !k.dequantize_row || !k.vec_dot)
    throw std::invalid_argument("mlxprog native: no kernels for GGML type id " +
                                std::to_string(type));
  return k;
}

}  // namespace

void ggml_matmul_rows(const Kernels& kernels, const quants::QuantKernels& table, int type,
                      const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N,
                      bool int8, float* y, int64_t ldy) {
  if (M == 0 || N == 0) return;
  const quants::TypeInfo& info = *quants::type_info(type);
  const quants::TypeKernels k = type_kernels(table, type);
  const int64_t row_bytes = K / info.block * info.block_bytes;
  const uint8_t* w_end = w + N * row_bytes;
  ThreadPool& pool = ThreadPool::instance();
  // Chunks of whole tiles, about four per thread (uneven rows balance).
  const int64_t tiles = (N + kRowsPerTile - 1) / kRowsPerTile;
  const int64_t grain = std::max<int64_t>(1, tiles / (4 * pool.threads()));
  if (int8) {
    const int act_block = quants::activation_block(info.activation);
    const size_t act_row = K / act_block * quants::activation_block_bytes(info.activation);
    auto quantize = table.quantize_activation[static_cast<int>(info.activation)];
    if (!quantize)
      quantize = quants::portable_table().quantize_activation[static_cast<int>(info.activation)];
    std::vector<uint8_t> xq(M * act_row);
    auto quantize_rows = [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) quantize(x + m * K, xq.data() + m * act_row, K);
    };
    // A decode step's row or two take less than waking the pool.
    if (M < 4 * pool.threads())
      quantize_rows(0, M);
    else
      pool.parallel_for(M, M / (4 * pool.threads()), quantize_rows);
    pool.parallel_for(tiles, grain, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t n0 = t * kRowsPerTile, n1 = std::min(N, n0 + kRowsPerTile);
        for (int64_t m = 0; m < M; ++m) {
          const uint8_t* xm = xq.data() + m * act_row;
          for (int64_t n = n0; n < n1; ++n) {
            // A row is a few hundred bytes: the prefetcher alone leaves the
            // next rows' loads waiting on memory (decode is memory-bound).
            if (m == 0) prefetch_rows(w + (n + kPrefetchRows) * row_bytes, row_bytes, w_end);
            y[m * ldy + n] = k.vec_dot(K, w + n * row_bytes, xm);
          }
        }
      }
    });
    return;
  }
  if (M >= kPanelGemmMinRows) {
    panel_gemm(kernels, x, M, K, N,
               [&](int64_t n, float* dst) { k.dequantize_row(w + n * row_bytes, dst, K); }, y,
               ldy);
    return;
  }
  auto dot = table.dot_f32 ? table.dot_f32 : quants::portable_table().dot_f32;
  pool.parallel_for(tiles, grain, [&](int64_t t0, int64_t t1) {
    std::vector<float> rows(kRowsPerTile * K);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * kRowsPerTile, n1 = std::min(N, n0 + kRowsPerTile);
      for (int64_t n = n0; n < n1; ++n)
        k.dequantize_row(w + n * row_bytes, rows.data() + (n - n0) * K, K);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = n0; n < n1; ++n)
          y[m * ldy + n] = dot(K, rows.data() + (n - n0) * K, x + m * K);
    }
  });
}

namespace {

// A primitive of this file: runs on the CPU only, on the kernel table it was
// built with (and that table's quant kernels).
class QuantPrimitive : public CpuPrimitive {
 public:
  QuantPrimitive(mx::Stream stream, const Kernels& kernels, int type)
      : CpuPrimitive(stream), kernels_(&kernels), table_(&quants::table_for(kernels.isa)),
        type_(type) {}

 protected:
  const Kernels* kernels_;
  const quants::QuantKernels* table_;
  int type_;
};

// out [..., N] float32 = x [..., K] @ dequantize(w).T, w uint8 [N, row_bytes].
// int8: each row of x quantized into the type's activation blocks and
// integer dot products (llama.cpp's numerics); else each weight row
// dequantized exactly and float32 products.
class GgmlMatmul : public QuantPrimitive {
 public:
  GgmlMatmul(mx::Stream stream, const Kernels& kernels, int type, bool int8)
      : QuantPrimitive(stream, kernels, type), int8_(int8) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    enqueue(out, [x = inputs[0], w = inputs[1], kernels = kernels_, table = table_,
                  type = type_, int8 = int8_](mx::array& out) {
      compute(x, w, out, *kernels, *table, type, int8);
    });
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape shape = inputs[0].shape();
    shape.back() = inputs[1].shape(0);
    return {shape};
  }

  const char* name() const override { return "MlxprogGgmlMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const GgmlMatmul*>(&other);
    return o && o->table_ == table_ && o->type_ == type_ && o->int8_ == int8_;
  }

 private:
  static void compute(const mx::array& x, const mx::array& w, mx::array& out,
                      const Kernels& kernels, const quants::QuantKernels& table, int type,
                      bool int8) {
    const int64_t K = x.shape(-1), N = w.shape(0), M = x.size() / std::max<int64_t>(K, 1);
    std::vector<float> keep_x;
    std::vector<uint8_t> keep_w;
    ggml_matmul_rows(kernels, table, type, float_rows(x, keep_x), M, K,
                     static_cast<const uint8_t*>(contiguous_data(w, keep_w)), N, int8, out.data<float>(), N);
  }

  bool int8_;
};

// out [..., K] float32 = each row of blocks [..., row_bytes] dequantized.
class GgmlDequantize : public QuantPrimitive {
 public:
  using QuantPrimitive::QuantPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    enqueue(out, [blocks = inputs[0], table = table_, type = type_](mx::array& out) {
          const quants::TypeKernels k = type_kernels(*table, type);
          const int64_t K = out.shape(-1), rows = out.size() / std::max<int64_t>(K, 1);
          const int64_t row_bytes = blocks.shape(-1);
          std::vector<uint8_t> keep;
          const uint8_t* src = static_cast<const uint8_t*>(contiguous_data(blocks, keep));
          float* dst = out.data<float>();
          ThreadPool& pool = ThreadPool::instance();
          pool.parallel_for(rows, std::max<int64_t>(1, rows / (4 * pool.threads())),
                            [&](int64_t r0, int64_t r1) {
                              for (int64_t r = r0; r < r1; ++r)
                                k.dequantize_row(src + r * row_bytes, dst + r * K, K);
                            });
    });
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const quants::TypeInfo& info = *quants::type_info(type_);
    mx::Shape shape = inputs[0].shape();
    shape.back() = shape.back() / info.block_bytes * info.block;
    return {shape};
  }

  const char* name() const override { return "MlxprogGgmlDequantize"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const GgmlDequantize*>(&other);
    return o && o->table_ == table_ && o->type_ == type_;
  }
};

// The type's info; invalid_argument for an id no kernel reads.
const quants::TypeInfo& checked_type(int type) {
  const quants::TypeInfo* info = quants::type_info(type);
  if (!info) throw std::invalid_argument("mlxprog native: GGML type id " + std::to_string(type) +
                                         " has no kernels");
  return *info;
}

}  // namespace

void bind_ggml(nb::module_& m) {
  m.def(
      "ggml_matmul",
      [](const mx::array& x, const mx::array& w, int type, bool int8) {
        const quants::TypeInfo& info = checked_type(type);
        if (w.ndim() != 2 || w.dtype() != mx::uint8 || x.ndim() < 1 ||
            x.shape(-1) % info.block || w.shape(1) != x.shape(-1) / info.block * info.block_bytes)
          throw std::invalid_argument(std::string("mlxprog native ggml_matmul: w must be uint8 "
                                                  "[N, K / block * block_bytes] of ") + info.name);
        mx::Shape shape = x.shape();
        shape.back() = w.shape(0);
        return mx::array(shape, mx::float32,
                         std::make_shared<GgmlMatmul>(mx::default_stream(mx::Device::cpu),
                                                      *active_kernels, type, int8),
                         {x, w});
      },
      nb::arg("x"), nb::arg("w"), nb::kw_only(), nb::arg("type"), nb::arg("int8") = false,
      "x [..., K] @ dequantize(w).T as float32, w uint8 [N, row_bytes] rows of GGML type "
      "`type` (GGUF's id); int8: llama.cpp's numerics (x quantized into 8-bit blocks, "
      "integer dot products).");
  m.def(
      "ggml_dequantize",
      [](const mx::array& blocks, int type) {
        const quants::TypeInfo& info = checked_type(type);
        if (blocks.dtype() != mx::uint8 || blocks.ndim() < 1 || blocks.shape(-1) % info.block_bytes)
          throw std::invalid_argument(std::string("mlxprog native ggml_dequantize: blocks must be "
                                                  "uint8 [..., whole blocks] of ") + info.name);
        mx::Shape shape = blocks.shape();
        shape.back() = shape.back() / info.block_bytes * info.block;
        return mx::array(shape, mx::float32,
                         std::make_shared<GgmlDequantize>(mx::default_stream(mx::Device::cpu),
                                                          *active_kernels, type),
                         {blocks});
      },
      nb::arg("blocks"), nb::kw_only(), nb::arg("type"),
      "Rows of GGML blocks of type `type` (GGUF's id), uint8 [..., row_bytes], as float32.");
  m.def(
      "set_codebook",
      [](const std::string& name, const mx::array& data) {
        mx::array dense = mx::contiguous(data);
        dense.eval();
        quants::set_codebook(name.c_str(), dense.data<void>(), dense.nbytes());
      },
      nb::arg("name"), nb::arg("data"),
      "Give the IQ kernels codebook `name` (the array's bytes; see mlxprog.ggml.codebooks).");
  m.def(
      "ggml_types",
      [] {
        std::vector<std::tuple<int, std::string, int, int>> types;
        for (int id = 0; id < quants::kTypeSlots; ++id)
          if (const quants::TypeInfo* t = quants::type_info(id))
            types.emplace_back(id, t->name, t->block, t->block_bytes);
        return types;
      },
      "The GGML types the kernels read: (GGUF id, name, block elements, block bytes).");
}

}  // namespace mlxprog
