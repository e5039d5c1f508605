// float32 matmul and convolution primitives (the kernels:
// kernels/*/gemm.h) and their Python functions, matmul and conv.
#include <algorithm>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "primitive.h"
#include "threadpool.h"

namespace mlxprog {
namespace {

// -- the GEMM on the thread pool -------------------------------------------------------------

// The calling thread's GEMM scratch, of at least gemm_workspace(cols) floats:
// kept between calls, since a fresh multi-megabyte buffer costs page faults.
float* gemm_scratch(int64_t cols) {
  thread_local std::vector<float> scratch;
  const size_t need = static_cast<size_t>(gemm_workspace(cols));
  if (scratch.size() < need) scratch.resize(need);
  return scratch.data();
}

// How one M x N product splits into tiles for the pool: row blocks first
// (a tile packs its rows of A, the costly gather of a convolution, and
// row blocks share one packing of B), column blocks when there are too few
// rows to go round. Row boundaries fall on multiples of the table's register
// tile rows (`rows`), so even a small M (a 7x7 feature map's 49 rows) splits
// into blocks the threads can share evenly (not one of 48 rows and one of
// 1); column boundaries on multiples of 32, which every table's panel width
// divides.
struct TileGrid {
  int64_t m_tiles, n_tiles, m_step, n_step;
};

TileGrid tile_grid(int64_t M, int64_t N, int64_t jobs, int64_t rows) {
  const int64_t threads = ThreadPool::instance().threads();
  // Several tiles per thread balance a pool shared with other work; fewer
  // when independent jobs (batch elements, groups) already go round.
  const int64_t want = (4 * threads + jobs - 1) / jobs;
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  int64_t m_tiles = std::max<int64_t>(1, std::min(ceil_div(M, rows), want));
  int64_t n_tiles = 1;
  if (m_tiles < want)
    n_tiles = std::max<int64_t>(1, std::min(ceil_div(N, 128), ceil_div(want, m_tiles)));
  const int64_t m_step = ceil_div(ceil_div(M, m_tiles), rows) * rows;
  const int64_t n_step = ceil_div(ceil_div(N, n_tiles), 32) * 32;
  return {ceil_div(M, m_step), ceil_div(N, n_step), m_step, n_step};
}

// The calling thread's buffer for B packed whole, of at least `floats`.
float* gemm_packed_b(int64_t floats) {
  thread_local std::vector<float> packed;
  if (packed.size() < static_cast<size_t>(floats)) packed.resize(floats);
  return packed.data();
}

// A weight's B packed whole (for one kernel table), kept for the next call
// with the same weight: constant weights (a model's convolutions and
// projections) are then packed once, as onnxruntime prepacks them. The entry
// holds the weight array, so its buffer, whose address is the key, cannot be
// freed and reused for another array while the entry exists.
struct PackedWeight {
  const Kernels* table;
  const void* data;
  mx::Shape shape;
  mx::Strides strides;
  int64_t jobs;
  mx::array owner;
  std::vector<float> packed;
};

// The bytes of packed weights kept, least recently used dropped first.
constexpr size_t kPackedWeightBytes = size_t{256} << 20;

// w's packing of `floats` floats: the kept one, or a new one made by
// pack(dst) and kept.
std::shared_ptr<const PackedWeight> packed_weight(const mx::array& w, int64_t jobs,
                                                  int64_t floats,
                                                  const std::function<void(float*)>& pack) {
  // Never destroyed: entries hold MLX arrays, which must not outlive MLX at exit.
  static std::mutex* mutex = new std::mutex;
  static auto* kept = new std::list<std::shared_ptr<PackedWeight>>;  // most recent first
  static size_t bytes = 0;
  const Kernels* table = active_kernels;
  {
    std::lock_guard<std::mutex> lock(*mutex);
    for (auto it = kept->begin(); it != kept->end(); ++it) {
      const PackedWeight& e = **it;
      if (e.table == table && e.data == w.data<void>() && e.jobs == jobs &&
          e.shape == w.shape() && e.strides == w.strides()) {
        kept->splice(kept->begin(), *kept, it);
        return kept->front();
      }
    }
  }
  auto entry = std::make_shared<PackedWeight>(
      PackedWeight{table, w.data<void>(), w.shape(), w.strides(), jobs, w, {}});
  entry->packed.resize(floats);
  pack(entry->packed.data());
  std::lock_guard<std::mutex> lock(*mutex);
  kept->push_front(entry);
  bytes += entry->packed.size() * sizeof(float);
  while (bytes > kPackedWeightBytes && kept->size() > 1) {
    bytes -= kept->back()->packed.size() * sizeof(float);
    kept->pop_back();
  }
  return entry;
}

// Run jobs GEMMs (problem(j) gives the j-th; all of one M x N x K) on the
// pool. `weight`: the array B is read from, when B is a weight worth keeping
// packed across calls (see PackedWeight), else null.
template <class Problem>
void run_gemms(int64_t jobs, int64_t M, int64_t N, int64_t K, const Problem& problem,
               const mx::array* weight) {
  if (jobs == 0 || M == 0 || N == 0) return;
  const Kernels& kernels = *active_kernels;
  const TileGrid grid = tile_grid(M, N, jobs, kernels.sgemm_rows);
  const int64_t per_job = grid.m_tiles * grid.n_tiles;
  ThreadPool& pool = ThreadPool::instance();
  // B is packed whole first (in parallel) for a kept weight, and where row
  // blocks would each pack the same B, unless that copy would be large. One
  // or two rows read B unpacked (sgemm), so they never pack it.
  const int64_t cols = gemm_packed_cols(N), per_b = K * cols;
  const bool whole_b = K > 0 && jobs * per_b <= (int64_t{8} << 20) &&
                       (weight ? M > 2 : grid.m_tiles > 1);
  auto pack = [&](float* dst) {
    const int64_t slices = (K + kGemmKC - 1) / kGemmKC, chunk = 256;
    const int64_t chunks = (N + chunk - 1) / chunk;
    pool.parallel_for(jobs * slices * chunks, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t j = t / (slices * chunks), s = (t / chunks) % slices, c = t % chunks;
        const int64_t k0 = s * kGemmKC, kc = std::min(kGemmKC, K - k0), n0 = c * chunk;
        kernels.sgemm_pack_b(problem(j), k0, kc, n0, std::min(chunk, N - n0),
                             dst + j * per_b + k0 * cols + n0 * kc);
      }
    });
  };
  std::shared_ptr<const PackedWeight> kept;
  const float* packed = nullptr;
  if (whole_b && weight) {
    kept = packed_weight(*weight, jobs, jobs * per_b, pack);
    packed = kept->packed.data();
  } else if (whole_b) {
    float* buffer = gemm_packed_b(jobs * per_b);
    pack(buffer);
    packed = buffer;
  }
  pool.parallel_for(jobs * per_job, 1, [&](int64_t t0, int64_t t1) {
    float* work = gemm_scratch(std::min(N, grid.n_step));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t j = t / per_job;
      const GemmProblem p = problem(j);
      const int64_t mi = (t % per_job) / grid.n_tiles, ni = t % grid.n_tiles;
      const int64_t m0 = mi * grid.m_step, n0 = ni * grid.n_step;
      kernels.sgemm(p, m0, std::min(M, m0 + grid.m_step), n0, std::min(N, n0 + grid.n_step),
                    work, packed ? packed + j * per_b : nullptr);
    }
  });
}

// -- matmul ------------------------------------------------------------------------------

// The shape of a @ b (rank >= 2 each): the broadcast batch dims, then M x N.
mx::Shape matmul_shape(const mx::array& a, const mx::array& b) {
  if (a.ndim() < 2 || b.ndim() < 2 || a.shape(-1) != b.shape(-2))
    throw std::invalid_argument("mlxprog native matmul: cannot multiply shapes " +
                                shape_text(a.shape()) + " and " + shape_text(b.shape()));
  mx::Shape a_batch(a.shape().begin(), a.shape().end() - 2);
  mx::Shape b_batch(b.shape().begin(), b.shape().end() - 2);
  mx::Shape shape = mx::broadcast_shapes(a_batch, b_batch);
  shape.push_back(a.shape(-2));
  shape.push_back(b.shape(-1));
  return shape;
}

// The element offset in x of each batch element of the broadcast batch
// shape `batch` (x's batch dims align with its trailing ones; a dim of size
// 1 repeats).
std::vector<int64_t> batch_offsets(const mx::array& x, const mx::Shape& batch) {
  int64_t count = 1;
  for (auto d : batch) count *= d;
  std::vector<int64_t> offsets(count, 0);
  const int lead = static_cast<int>(batch.size()) - static_cast<int>(x.ndim() - 2);
  std::vector<int64_t> index(batch.size(), 0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t offset = 0;
    for (int d = std::max(lead, 0); d < static_cast<int>(batch.size()); ++d)
      if (x.shape(d - lead) != 1) offset += index[d] * x.strides()[d - lead];
    offsets[i] = offset;
    for (int d = static_cast<int>(batch.size()) - 1; d >= 0; --d) {
      if (++index[d] < batch[d]) break;
      index[d] = 0;
    }
  }
  return offsets;
}

// out = a @ b, float32, a and b read in place through their strides.
void run_matmul(const mx::array& a, const mx::array& b, mx::array& out) {
  const int64_t M = a.shape(-2), K = a.shape(-1), N = b.shape(-1);
  const mx::Shape batch(out.shape().begin(), out.shape().end() - 2);
  const std::vector<int64_t> a_offsets = batch_offsets(a, batch);
  const std::vector<int64_t> b_offsets = batch_offsets(b, batch);
  const float* a_data = a.data<float>();
  const float* b_data = b.data<float>();
  float* c = out.data<float>();
  // A size-1 axis's stride may be anything MLX left there; it is never stepped.
  const int64_t a_rs = a.strides()[a.ndim() - 2], a_cs = a.strides()[a.ndim() - 1];
  const int64_t b_rs = b.strides()[b.ndim() - 2], b_cs = b.strides()[b.ndim() - 1];
  // A 2-D b shared by the whole batch is most likely a weight; a batch of
  // b's (attention scores, values) changes every call.
  const int64_t jobs = static_cast<int64_t>(a_offsets.size());
  run_gemms(jobs, M, N, K, [&](int64_t j) {
    return GemmProblem{a_data + a_offsets[j], a_rs, a_cs, b_data + b_offsets[j], b_rs, b_cs,
                       c + j * M * N, N, M, N, K, nullptr};
  }, b.ndim() == 2 && jobs == 1 ? &b : nullptr);
}

class Matmul : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    enqueue(out, [a = inputs[0], b = inputs[1]](mx::array& out) { run_matmul(a, b, out); });
  }

  // Shapeless compilation asks again for each new input shape.
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {matmul_shape(inputs[0], inputs[1])};
  }

  const char* name() const override { return "MlxprogMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const Matmul*>(&other) != nullptr;
  }
};

mx::array matmul(const mx::array& a, const mx::array& b) {
  if (a.dtype() != mx::float32 || b.dtype() != mx::float32)
    throw std::invalid_argument("mlxprog native matmul: operands must be float32");
  return mx::array(matmul_shape(a, b), mx::float32,
                   std::make_shared<Matmul>(mx::default_stream(mx::Device::cpu)), {a, b});
}

// -- convolution -------------------------------------------------------------------------

// A convolution's attributes, per spatial dimension (1 to 3 of them), and
// its epilogue: whether a bias and a residual (inputs 2 and 3, or 2 alone)
// are added, and the activation then applied.
struct ConvSettings {
  std::vector<int64_t> stride, pad_low, pad_high, dilation;
  int groups;
  bool bias, residual;
  Activation activation;
  bool operator==(const ConvSettings& o) const {
    return stride == o.stride && pad_low == o.pad_low && pad_high == o.pad_high &&
           dilation == o.dilation && groups == o.groups && bias == o.bias &&
           residual == o.residual && activation == o.activation;
  }
};

// The result shape [N, *spatial_out, C_out] of convolving x by w.
mx::Shape conv_shape(const mx::array& x, const mx::array& w, const ConvSettings& s) {
  const size_t spatial = s.stride.size();
  if (x.ndim() != spatial + 2 || w.ndim() != spatial + 2)
    throw std::invalid_argument("mlxprog native conv: input " + shape_text(x.shape()) +
                                " and weight " + shape_text(w.shape()) + " need " +
                                std::to_string(spatial) + " spatial dimension(s)");
  mx::Shape shape = {x.shape(0)};
  for (size_t d = 0; d < spatial; ++d) {
    const int64_t span = (w.shape(d + 1) - 1) * s.dilation[d] + 1;
    shape.push_back(static_cast<int>(
        (x.shape(d + 1) + s.pad_low[d] + s.pad_high[d] - span) / s.stride[d] + 1));
  }
  shape.push_back(w.shape(0));
  return shape;
}

// A float32 array's data, row-contiguous: its own buffer, or a copy in
// `keep` that walks the last axis through its stride (a weight transposed
// from another layout, e.g. [C_out, C_in, kh, kw] seen as [C_out, kh, kw,
// C_in], has no dense axis to copy in runs, and is copied on every call).
const float* dense_floats(const mx::array& a, std::vector<float>& keep) {
  if (a.flags().row_contiguous) return a.data<float>();
  keep.resize(a.size());
  if (a.size() == 0) return keep.data();
  const float* src = a.data<float>();
  const int nd = static_cast<int>(a.ndim());
  const int64_t last = a.shape(-1), step = a.strides()[nd - 1];
  std::vector<int64_t> index(nd, 0);
  float* dst = keep.data();
  for (size_t row = 0; row < a.size() / last; ++row, dst += last) {
    int64_t offset = 0;
    for (int d = 0; d < nd - 1; ++d) offset += index[d] * a.strides()[d];
    const float* from = src + offset;
    for (int64_t i = 0; i < last; ++i) dst[i] = from[i * step];
    for (int d = nd - 2; d >= 0; --d) {
      if (++index[d] < a.shape(d)) break;
      index[d] = 0;
    }
  }
  return keep.data();
}

// out = activation(conv(x, w) + bias + residual), bias (C_out values) and
// residual (out's shape) optional.
void run_conv(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
              const std::optional<mx::array>& residual, const ConvSettings& s, mx::array& out) {
  if (out.size() == 0) return;
  std::vector<float> keep_x, keep_w, keep_bias, keep_residual;
  const float* xd = dense_floats(x, keep_x);
  const float* wd = dense_floats(w, keep_w);
  const float* bd = bias ? dense_floats(*bias, keep_bias) : nullptr;
  const float* rd = residual ? dense_floats(*residual, keep_residual) : nullptr;
  const int spatial = static_cast<int>(s.stride.size());
  // Dimensions as three, the missing leading ones of size 1.
  ConvGeometry g{};
  g.channels = x.shape(-1);
  g.group_channels = w.shape(-1);
  bool pointwise = true;  // 1 x 1 kernel, stride 1, no padding: A is x itself
  for (int d = 0; d < 3; ++d) {
    const int src = d - (3 - spatial);  // the matching dimension of x, or < 0
    g.in[d] = src < 0 ? 1 : x.shape(src + 1);
    g.out[d] = src < 0 ? 1 : out.shape(src + 1);
    g.kernel[d] = src < 0 ? 1 : w.shape(src + 1);
    g.stride[d] = src < 0 ? 1 : s.stride[src];
    g.pad[d] = src < 0 ? 0 : s.pad_low[src];
    g.dilation[d] = src < 0 ? 1 : s.dilation[src];
    pointwise &= g.kernel[d] == 1 && g.stride[d] == 1 && g.pad[d] == 0 && g.in[d] == g.out[d];
  }
  const int64_t batch = x.shape(0), c_out = w.shape(0);
  const int64_t taps = g.kernel[0] * g.kernel[1] * g.kernel[2];
  float* o = out.data<float>();
  if (s.groups == g.channels && c_out == g.channels) {  // depthwise: no GEMM at all
    std::vector<float> transposed(taps * c_out);
    for (int64_t c = 0; c < c_out; ++c)
      for (int64_t t = 0; t < taps; ++t) transposed[t * c_out + c] = wd[c * taps + t];
    DepthwiseProblem p{xd, transposed.data(), o, g, batch, Epilogue{bd, rd, s.activation}};
    const int64_t rows = batch * g.out[0] * g.out[1];
    const Kernels& kernels = *active_kernels;
    ThreadPool::instance().parallel_for(rows, grain_for(rows, 4, 1, 64),
                                        [&](int64_t r0, int64_t r1) {
                                          kernels.depthwise_conv(p, r0, r1);
                                        });
    return;
  }
  // Per group: C[:, group's outputs] = patches(x, group's channels) @ w[group]^T.
  const int64_t M = batch * g.out[0] * g.out[1] * g.out[2];
  const int64_t N = c_out / s.groups, K = taps * g.group_channels;
  run_gemms(s.groups, M, N, K, [&](int64_t group) {
    return GemmProblem{xd + group * g.group_channels, pointwise ? g.channels : 0, 1,
                       wd + group * N * K, 1, K, o + group * N, c_out, M, N, K,
                       pointwise ? nullptr : &g,
                       Epilogue{bd ? bd + group * N : nullptr, rd ? rd + group * N : nullptr,
                                s.activation}};
  }, &w);
}

class Conv : public CpuPrimitive {
 public:
  Conv(mx::Stream stream, ConvSettings settings)
      : CpuPrimitive(stream), settings_(std::move(settings)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    std::optional<mx::array> bias, residual;
    if (settings_.bias) bias = inputs[2];
    if (settings_.residual) residual = inputs.back();
    enqueue(out, [x = inputs[0], w = inputs[1], bias, residual,
                  settings = settings_](mx::array& out) {
      run_conv(x, w, bias, residual, settings, out);
    });
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {conv_shape(inputs[0], inputs[1], settings_)};
  }

  const char* name() const override { return "MlxprogConv"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const Conv*>(&other);
    return o && o->settings_ == settings_;
  }

 private:
  ConvSettings settings_;
};

// The activations conv takes, by name.
Activation activation_named(const std::string& name) {
  if (name == "none") return Activation::none;
  if (name == "relu") return Activation::relu;
  throw std::invalid_argument("mlxprog native conv: unknown activation '" + name +
                              "' (none or relu)");
}

mx::array conv(const mx::array& x, const mx::array& w, std::vector<int64_t> stride,
               std::vector<int64_t> pad_low, std::vector<int64_t> pad_high,
               std::vector<int64_t> dilation, int groups, std::optional<mx::array> bias,
               std::optional<mx::array> residual, const std::string& activation) {
  const size_t spatial = stride.size();
  if (spatial < 1 || spatial > 3 || pad_low.size() != spatial || pad_high.size() != spatial ||
      dilation.size() != spatial)
    throw std::invalid_argument(
        "mlxprog native conv: stride, pad_low, pad_high and dilation need one entry per spatial "
        "dimension (1 to 3)");
  if (x.dtype() != mx::float32 || w.dtype() != mx::float32)
    throw std::invalid_argument("mlxprog native conv: operands must be float32");
  if (groups < 1 || x.ndim() != w.ndim() || x.shape(-1) != w.shape(-1) * groups ||
      w.shape(0) % groups)
    throw std::invalid_argument("mlxprog native conv: input " + shape_text(x.shape()) +
                                " and weight " + shape_text(w.shape()) + " do not fit " +
                                std::to_string(groups) + " group(s)");
  if (bias && (bias->dtype() != mx::float32 || bias->ndim() != 1 || bias->shape(0) != w.shape(0)))
    throw std::invalid_argument("mlxprog native conv: the bias must be float32 [" +
                                std::to_string(w.shape(0)) + "], one per output channel; found " +
                                shape_text(bias->shape()));
  ConvSettings settings{std::move(stride), std::move(pad_low), std::move(pad_high),
                        std::move(dilation), groups, bias.has_value(),
                        residual.has_value(), activation_named(activation)};
  mx::Shape shape = conv_shape(x, w, settings);
  if (residual && (residual->dtype() != mx::float32 || residual->shape() != shape))
    throw std::invalid_argument("mlxprog native conv: the residual must be float32 " +
                                shape_text(shape) + ", the result's shape; found " +
                                shape_text(residual->shape()));
  std::vector<mx::array> inputs = {x, w};
  if (bias) inputs.push_back(*bias);
  if (residual) inputs.push_back(*residual);
  return mx::array(std::move(shape), mx::float32,
                   std::make_shared<Conv>(mx::default_stream(mx::Device::cpu), std::move(settings)),
                   std::move(inputs));
}

}  // namespace

void bind_gemm_conv(nb::module_& m) {
  m.def("matmul", &matmul, nb::arg("a"), nb::arg("b"),
        "a @ b for float32 a [..., M, K] and b [..., K, N] (rank >= 2, batch dims "
        "broadcast), read through their strides (transposed views are not copied).");
  m.def("conv", &conv, nb::arg("x"), nb::arg("w"), nb::kw_only(), nb::arg("stride"),
        nb::arg("pad_low"), nb::arg("pad_high"), nb::arg("dilation"), nb::arg("groups"),
        nb::arg("bias") = nb::none(), nb::arg("residual") = nb::none(),
        nb::arg("activation") = "none",
        "Cross-correlation of float32 x [N, *spatial, C_in] with w [C_out, *kernel, "
        "C_in / groups] (1 to 3 spatial dimensions), as mx.conv_general without input "
        "dilation or flip, plus bias (float32 [C_out], optional) and residual (float32, "
        "the result's shape, optional), then the activation ('none' or 'relu'): all "
        "applied as each output tile is finished.");
}

}  // namespace mlxprog
