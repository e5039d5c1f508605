// GGML's block-quantized weights (GGUF's) as MLX primitives: ggml_matmul
// (x @ w.T with w a GGML type's rows of blocks), ggml_gather_matmul (the
// same with each slot's expert of a stack of such matrices) and
// ggml_dequantize (rows of blocks to float32), on the per-type kernels of quants/ and the thread
// pool; and their Python functions, with set_codebook and ggml_types.
#include "primitives/ggml_matmul.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
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

// From this many rows of x on (a prefill, an expert's slots in one), the
// int8 products run the int8 GEMM: each tile of weight rows is unpacked
// once (the type's unpack_row) for all the rows, instead of every block
// being decoded again in each row's dot product. Fewer rows (a decode step,
// a small batch) take one vec_dot per pair, so a row's result is the same
// whatever other rows below this count share its product.
constexpr int64_t kInt8GemmMinRows = 16;

// How far ahead of the row being multiplied the weight rows are prefetched.
constexpr int64_t kPrefetchRows = 8;

// Ask for the cache lines of one weight row (`bytes` from `row`, cut at
// `end`) ahead of its use.
inline void prefetch_rows(const uint8_t* row, int64_t bytes, const uint8_t* end) {
  const uint8_t* stop = row + bytes < end ? row + bytes : end;
  for (const uint8_t* p = row; p < stop; p += 64) __builtin_prefetch(p, 0, 3);
}

// The grain of a pool job over `items` pieces of work: about
// `chunks_per_thread` chunks a thread (four by default, so that uneven
// pieces balance).
int64_t grain_of(int64_t items, const ThreadPool& pool, int64_t chunks_per_thread = 4) {
  return std::max<int64_t>(1, items / (chunks_per_thread * pool.threads()));
}

// The type's kernels in the quant table of kernel table `isa`.
quants::TypeKernels type_kernels(const quants::QuantKernels& table, int type) {
  quants::TypeKernels k{};
  if (!quants::resolve(table, type, k) || !k.dequantize_row || !k.vec_dot)
    throw std::invalid_argument("mlxprog native: no kernels for GGML type id " +
                                std::to_string(type));
  return k;
}

// x's M rows (M x K float32) quantized into the type's activation blocks
// (act_row bytes a row), on the pool when there are many.
std::vector<uint8_t> quantize_activations(const quants::QuantKernels& table,
                                          const quants::TypeInfo& info, const float* x,
                                          int64_t M, int64_t K, size_t act_row) {
  const quants::Quantizer quantize = quants::resolve_quantizer(table, info.activation);
  std::vector<uint8_t> xq(M * act_row);
  auto quantize_rows = [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) quantize(x + m * K, xq.data() + m * act_row, K);
  };
  ThreadPool& pool = ThreadPool::instance();
  // A decode step's row or two take less than waking the pool.
  if (M < 4 * pool.threads())
    quantize_rows(0, M);
  else
    pool.parallel_for(M, grain_of(M, pool), quantize_rows);
  return xq;
}

// One tile of weight rows [n0, n1) of w (rows of row_bytes, the matrix ending
// at w_end) against `count` rows of x, int8 numerics: for i < count, with
// (xi, yi) = rows(i), y[yi * ldy + n] = vec_dot(w row n, xq row xi). The
// tile's blocks stay in L1 while the rows of x pass over them.
template <class Rows>
void int8_tile(const quants::TypeKernels& k, int64_t K, const uint8_t* w, int64_t row_bytes,
               const uint8_t* w_end, int64_t n0, int64_t n1, const uint8_t* xq, size_t act_row,
               int64_t count, const Rows& rows, float* y, int64_t ldy) {
  for (int64_t i = 0; i < count; ++i) {
    const auto [xi, yi] = rows(i);
    const uint8_t* xm = xq + xi * act_row;
    int64_t n = n0;
    if (k.vec_dot_4)
      for (; n + 4 <= n1; n += 4) {
        // A row is a few hundred bytes: the prefetcher alone leaves the
        // next rows' loads waiting on memory (decode is memory-bound).
        if (i == 0) prefetch_rows(w + (n + kPrefetchRows) * row_bytes, 4 * row_bytes, w_end);
        k.vec_dot_4(K, w + n * row_bytes, row_bytes, xm, y + yi * ldy + n);
      }
    for (; n < n1; ++n) {
      if (i == 0) prefetch_rows(w + (n + kPrefetchRows) * row_bytes, row_bytes, w_end);
      y[yi * ldy + n] = k.vec_dot(K, w + n * row_bytes, xm);
    }
  }
}

// Tiles [t0, t1) of w's N weight rows (kRowsPerTile rows each) against
// `count` rows of x (xq: their activation blocks, act_row bytes each, dense)
// by the int8 GEMM: each tile's rows unpacked (unpacked_row bytes each, the
// type's unpack_row), then y[i * ldy + n] for i < count.
void int8_gemm_tiles(const quants::TypeKernels& k, quants::Int8Gemm gemm, int64_t K,
                     const uint8_t* w, int64_t row_bytes, int64_t N, int64_t t0, int64_t t1,
                     const uint8_t* xq, size_t act_row, int64_t count, float* y, int64_t ldy,
                     size_t unpacked_row) {
  std::vector<uint8_t> unpacked(kRowsPerTile * unpacked_row);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n0 = t * kRowsPerTile, n1 = std::min(N, n0 + kRowsPerTile);
    for (int64_t n = n0; n < n1; ++n)
      k.unpack_row(w + n * row_bytes, unpacked.data() + (n - n0) * unpacked_row, K);
    gemm(K, unpacked.data(), n1 - n0, k.signed_codes, xq, act_row, count, y + n0, ldy);
  }
}

// The exact numerics' counterpart of int8_tile for a few rows of x: each
// weight row of the tile dequantized into `scratch` (K floats: it stays in
// L1, where a whole tile's rows would not), then its float32 dot products
// with x's rows (dense, K floats each).
template <class Rows>
void exact_tile(const quants::TypeKernels& k, const quants::QuantKernels& table, int64_t K,
                const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const float* x,
                int64_t count, const Rows& rows, float* y, int64_t ldy, float* scratch) {
  const quants::DotF32 dot = quants::resolve_dot_f32(table);
  for (int64_t n = n0; n < n1; ++n) {
    k.dequantize_row(w + n * row_bytes, scratch, K);
    for (int64_t i = 0; i < count; ++i) {
      const auto [xi, yi] = rows(i);
      y[yi * ldy + n] = dot(K, scratch, x + xi * K);
    }
  }
}

// The rows of a dense matrix: row i of x is row i of y.
std::pair<int64_t, int64_t> same_row(int64_t i) { return {i, i}; }

}  // namespace

void ggml_matmul_parts(const Kernels& kernels, const quants::QuantKernels& table,
                       const std::vector<GgmlPart>& parts, const float* x, int64_t M, int64_t K,
                       bool int8, float* y, int64_t ldy) {
  if (M == 0) return;
  // Each part's kernels and layout, its activation row's bytes, and the
  // columns of y it fills.
  struct Layout {
    quants::TypeKernels k;
    const quants::TypeInfo* info;
    const uint8_t* w;
    int64_t rows, row_bytes, column, tiles;
    size_t act_row;
  };
  std::vector<Layout> layouts;
  int64_t columns = 0;
  for (const GgmlPart& part : parts) {
    const quants::TypeInfo* info = quants::type_info(part.type);
    layouts.push_back({type_kernels(table, part.type), info, part.w, part.rows,
                       K / info->block * info->block_bytes, columns,
                       (part.rows + kRowsPerTile - 1) / kRowsPerTile,
                       quants::activation_row_bytes(*info, K)});
    columns += part.rows;
  }
  if (columns == 0) return;
  ThreadPool& pool = ThreadPool::instance();
  // The parts whose products go tile by tile (few rows of x: a decode step)
  // share one pool job over all their tiles, the parts' tiles one after
  // another, rather than a job and a wait per part. `xq` holds x quantized
  // into each activation type the parts need (int8), once per type.
  std::vector<const Layout*> tiled;
  std::vector<std::vector<uint8_t>> xq(int8 ? quants::kActivations : 0);
  auto quantized = [&](const Layout& l) -> const std::vector<uint8_t>& {
    std::vector<uint8_t>& q = xq[static_cast<int>(l.info->activation)];
    if (q.empty())
      q = quantize_activations(table, *l.info, x, M, K, l.act_row);
    return q;
  };
  if (int8) {
    for (const Layout& l : layouts) {
      if (M < kInt8GemmMinRows) {
        tiled.push_back(&l);
        continue;
      }
      // Many rows: each tile of weight rows is unpacked once for all of
      // them (the type's unpack_row) and multiplied by the int8 GEMM.
      const std::vector<uint8_t>& q = quantized(l);
      const quants::Int8Gemm gemm = quants::resolve_int8_gemm(table, l.info->activation);
      const size_t unpacked_row = quants::int8_row_bytes(*l.info, K);
      pool.parallel_for(l.tiles, grain_of(l.tiles, pool), [&](int64_t t0, int64_t t1) {
        int8_gemm_tiles(l.k, gemm, K, l.w, l.row_bytes, l.rows, t0, t1, q.data(), l.act_row,
                        M, y + l.column, ldy, unpacked_row);
      });
    }
  } else if (M >= kPanelGemmMinRows) {
    // Many rows: one GEMM over every part's rows (x packed once), each
    // weight row dequantized exactly as its part's type gives it.
    panel_gemm(kernels, x, M, K, columns,
               [&](int64_t n, float* dst) {
                 const Layout* l = layouts.data();
                 while (n >= l->column + l->rows) ++l;
                 l->k.dequantize_row(l->w + (n - l->column) * l->row_bytes, dst, K);
               },
               y, ldy);
    return;
  } else {
    for (const Layout& l : layouts) tiled.push_back(&l);
  }
  if (tiled.empty()) return;
  for (const Layout* l : tiled)
    if (int8) quantized(*l);
  // Work items: (part, tile of its rows), part by part.
  std::vector<int64_t> first_item;  // each tiled part's first item
  int64_t items = 0;
  for (const Layout* l : tiled) {
    first_item.push_back(items);
    items += l->tiles;
  }
  // Tiles of a few rows (a decode step's) cost alike: two chunks a thread.
  // Each chunk starts a new stream of weight rows whose first rows wait on
  // memory (the prefetches run ahead within a chunk), which cost more than
  // the imbalance finer chunks would save (IQ4_XS decode +5% against four a
  // thread, Q4_K_M level; docs/benchmarks.md).
  pool.parallel_for(items, grain_of(items, pool, 2), [&](int64_t i0, int64_t i1) {
    std::vector<float> scratch(int8 ? 0 : K);
    size_t j = 0;
    for (int64_t item = i0; item < i1; ++item) {
      while (j + 1 < tiled.size() && item >= first_item[j + 1]) ++j;
      const Layout& l = *tiled[j];
      const int64_t t = item - first_item[j];
      const int64_t n0 = t * kRowsPerTile, n1 = std::min(l.rows, n0 + kRowsPerTile);
      if (int8)
        int8_tile(l.k, K, l.w, l.row_bytes, l.w + l.rows * l.row_bytes, n0, n1,
                  xq[static_cast<int>(l.info->activation)].data(), l.act_row, M, same_row,
                  y + l.column, ldy);
      else
        exact_tile(l.k, table, K, l.w, l.row_bytes, n0, n1, x, M, same_row, y + l.column, ldy,
                   scratch.data());
    }
  });
}

void ggml_matmul_rows(const Kernels& kernels, const quants::QuantKernels& table, int type,
                      const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N,
                      bool int8, float* y, int64_t ldy) {
  ggml_matmul_parts(kernels, table, {GgmlPart{type, w, N}}, x, M, K, int8, y, ldy);
}

void ggml_gather_rows(const Kernels& kernels, const quants::QuantKernels& table, int type,
                      const float* x, int64_t rows, int64_t K, const uint8_t* w, int64_t N,
                      const ExpertSlots& slots, bool per_slot, bool int8, float* y) {
  if (slots.chosen().empty() || N == 0) return;
  const quants::TypeInfo& info = *quants::type_info(type);
  const quants::TypeKernels k = type_kernels(table, type);
  const int64_t row_bytes = K / info.block * info.block_bytes, expert_bytes = N * row_bytes;
  // (slot's row of x, slot's row of y) of expert e's i-th slot.
  auto slot_rows = [&](int64_t e) {
    return [&slots, e, per_slot](int64_t i) { return slots.rows(e, i, per_slot); };
  };
  ThreadPool& pool = ThreadPool::instance();
  const int64_t tiles = (N + kRowsPerTile - 1) / kRowsPerTile;
  // An expert with many slots (a prefill) multiplies its rows of x gathered
  // together, the experts side by side (a GEMM started inside a pool job
  // runs on its thread): int8, by the int8 GEMM on its unpacked weight rows;
  // exact, by the panel GEMM. The others take the pool tile by tile: a tile
  // of an expert's weight rows against each of its slots' rows.
  const int64_t panel_rows = int8 ? kInt8GemmMinRows : kPanelGemmMinRows;
  std::vector<int64_t> many, few;
  for (int64_t e : slots.chosen()) (slots.count(e) >= panel_rows ? many : few).push_back(e);
  const size_t act_row = int8 ? quants::activation_row_bytes(info, K) : 0;
  const std::vector<uint8_t> xq =
      int8 ? quantize_activations(table, info, x, rows, K, act_row) : std::vector<uint8_t>();
  const quants::Int8Gemm gemm = int8 ? quants::resolve_int8_gemm(table, info.activation) : nullptr;
  const size_t unpacked_row = int8 ? quants::int8_row_bytes(info, K) : 0;
  pool.parallel_for(static_cast<int64_t>(many.size()), 1, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t e = many[j], count = slots.count(e);
      std::vector<float> product(count * N);
      const auto rows_of = slot_rows(e);
      const uint8_t* we = w + e * expert_bytes;
      if (int8) {
        std::vector<uint8_t> gathered(count * act_row);
        for (int64_t i = 0; i < count; ++i)
          std::memcpy(gathered.data() + i * act_row, xq.data() + rows_of(i).first * act_row,
                      act_row);
        int8_gemm_tiles(k, gemm, K, we, row_bytes, N, 0, tiles, gathered.data(), act_row, count,
                        product.data(), N, unpacked_row);
      } else {
        std::vector<float> gathered(count * K);
        for (int64_t i = 0; i < count; ++i)
          std::memcpy(gathered.data() + i * K, x + rows_of(i).first * K, K * sizeof(float));
        panel_gemm(kernels, gathered.data(), count, K, N,
                   [&](int64_t n, float* dst) { k.dequantize_row(we + n * row_bytes, dst, K); },
                   product.data(), N);
      }
      for (int64_t i = 0; i < count; ++i)
        std::memcpy(y + rows_of(i).second * N, product.data() + i * N, N * sizeof(float));
    }
  });
  // Work items: (expert, tile of its rows), expert by expert, so a chunk
  // reads one expert's rows once for all of its slots.
  const int64_t items = static_cast<int64_t>(few.size()) * tiles;
  pool.parallel_for(items, grain_of(items, pool), [&](int64_t i0, int64_t i1) {
    std::vector<float> scratch(int8 ? 0 : K);
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t e = few[item / tiles], t = item % tiles;
      const int64_t n0 = t * kRowsPerTile, n1 = std::min(N, n0 + kRowsPerTile);
      const uint8_t* we = w + e * expert_bytes;
      if (int8)
        int8_tile(k, K, we, row_bytes, we + expert_bytes, n0, n1, xq.data(), act_row,
                  slots.count(e), slot_rows(e), y, N);
      else
        exact_tile(k, table, K, we, row_bytes, n0, n1, x, slots.count(e), slot_rows(e), y, N,
                   scratch.data());
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

// out [..., k, N] float32: slot j of each row of indices [..., k] times its
// expert of w uint8 [E, N, row_bytes], x [..., K] (one row per token) or,
// per_slot, [..., k, K]. Indices are read as integers, negative ones counted
// from the end and the rest clamped into [0, E).
class GgmlGatherMatmul : public QuantPrimitive {
 public:
  GgmlGatherMatmul(mx::Stream stream, const Kernels& kernels, int type, bool int8, bool per_slot)
      : QuantPrimitive(stream, kernels, type), int8_(int8), per_slot_(per_slot) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    enqueue(out, [x = inputs[0], w = inputs[1], indices = inputs[2], kernels = kernels_,
                  table = table_, type = type_, int8 = int8_,
                  per_slot = per_slot_](mx::array& out) {
      const int64_t K = x.shape(-1), N = w.shape(1);
      const ExpertSlots slots(indices, w.shape(0));
      std::vector<float> keep_x;
      std::vector<uint8_t> keep_w;
      const float* rows = float_rows(x, keep_x);
      ggml_gather_rows(*kernels, *table, type, rows, x.size() / std::max<int64_t>(K, 1), K,
                       static_cast<const uint8_t*>(contiguous_data(w, keep_w)), N, slots,
                       per_slot, int8, out.data<float>());
    });
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape shape = inputs[2].shape();
    shape.push_back(inputs[1].shape(1));
    return {shape};
  }

  const char* name() const override { return "MlxprogGgmlGatherMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const GgmlGatherMatmul*>(&other);
    return o && o->table_ == table_ && o->type_ == type_ && o->int8_ == int8_ &&
           o->per_slot_ == per_slot_;
  }

 private:
  bool int8_, per_slot_;
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
          pool.parallel_for(rows, grain_of(rows, pool),
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
      "ggml_gather_matmul",
      [](const mx::array& x, const mx::array& w, const mx::array& indices, int type, bool int8,
         bool per_slot) {
        const quants::TypeInfo& info = checked_type(type);
        const int64_t K = x.ndim() ? x.shape(-1) : 0;
        bool fits = w.ndim() == 3 && w.dtype() == mx::uint8 && w.shape(0) > 0 &&
                    K % info.block == 0 && w.shape(2) == K / info.block * info.block_bytes &&
                    indices.ndim() >= 1 &&
                    mx::issubdtype(indices.dtype(), mx::integer) &&
                    x.ndim() == indices.ndim() + (per_slot ? 1 : 0);
        for (int d = 0; fits && d < indices.ndim() - (per_slot ? 0 : 1); ++d)
          fits = x.shape(d) == indices.shape(d);
        if (!fits)
          throw std::invalid_argument(
              std::string("mlxprog native ggml_gather_matmul: needs x [..., K] (per slot [..., k, "
                          "K]), w uint8 [E, N, K / block * block_bytes] of ") +
              info.name + " and integer indices [..., k]");
        mx::Shape shape = indices.shape();
        shape.push_back(w.shape(1));
        return mx::array(shape, mx::float32,
                         std::make_shared<GgmlGatherMatmul>(mx::default_stream(mx::Device::cpu),
                                                            *active_kernels, type, int8, per_slot),
                         {x, w, indices});
      },
      nb::arg("x"), nb::arg("w"), nb::arg("indices"), nb::kw_only(), nb::arg("type"),
      nb::arg("int8") = false, nb::arg("per_slot") = false,
      "For each slot of indices [..., k]: x [..., K] (per_slot: [..., k, K]) @ dequantize(w[e]).T "
      "as float32 [..., k, N], w uint8 [E, N, row_bytes] experts of GGML type `type`; int8: "
      "llama.cpp's numerics, x quantized once per row. Reads only the chosen experts' rows, "
      "each once for all its slots.");
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
        if (!quants::set_codebook(name.c_str(), dense.data<void>(), dense.nbytes()))
          throw std::invalid_argument("set_codebook: no codebook '" + name + "' of " +
                                      std::to_string(dense.nbytes()) + " bytes");
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
