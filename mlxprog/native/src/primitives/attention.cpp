// Attention over a KV cache as MLX primitives (the kernels:
// kernels/*/attention.h): cache_attention over a float or quantized cache,
// and cache_attention_block, a llama-style attention block (heads, RoPE,
// cache writes, attention) as one node; with the Python functions hadamard
// and quantize_rows that tests check the kernels' cache transform and
// quantization with.
#include "primitives/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include "primitives/norms.h"
#include "primitives/rope.h"
#include "threadpool.h"

namespace mlxprog {
namespace {

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
  p.format = format;
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

// A quantized cache's recent ring as the kernel reads it (RecentRows), of R
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
// query rows (float; a prefill's chunks are blocks of a head's consecutive
// positions, which the kernel scores together), or (batch, KV head, query
// position) (quantized).
void run_attention(const AttentionProblem& p) {
  const Kernels& kernels = *active_kernels;
  if (!p.format.quantized()) {
    const int64_t grain = std::min<int64_t>(p.T, kAttentionQueryBlock);
    ThreadPool::instance().parallel_for(p.B * p.H * p.T, grain, [&](int64_t i0, int64_t i1) {
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
                 float softcap, CacheFormat format, bool has_recent, bool has_sinks)
      : CpuPrimitive(stream), scale_(scale), has_key_mask_(has_key_mask), window_(window),
        softcap_(softcap), format_(format), has_recent_(has_recent), has_sinks_(has_sinks) {}

  // inputs: q [B, H, T, D] (float32), the cache's arrays (k and v [B, H_kv,
  // S, D] float32, or of each the codes [B, H_kv, S, D * bits / 32] uint32
  // and the scales and biases [B, H_kv, S, D / group_size] float32), start
  // (int32, one element), key_mask [B, S] (bool) when has_key_mask, and a
  // quantized cache's recent ring when has_recent: k_recent, v_recent [B,
  // H_kv, R, D] (float32), recent_slots [B, R] (int32), new_k, new_v [B,
  // H_kv, T, D] (float32), see RecentRows; last, sinks [H] (float32) when
  // has_sinks.
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    enqueue(out, [inputs, scale = scale_, has_key_mask = has_key_mask_, window = window_,
                  softcap = softcap_, format = format_,
                  has_recent = has_recent_, has_sinks = has_sinks_](mx::array& out) mutable {
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
      if (has_sinks) {
        const size_t last = inputs.size() - 1;
        p.sinks = static_cast<const float*>(contiguous_data(inputs[last], keep[last]));
      }
      run_attention(p);
    });
  }

  const char* name() const override { return "MlxprogCacheAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const CacheAttention*>(&other);
    return o && o->scale_ == scale_ && o->has_key_mask_ == has_key_mask_ &&
           o->window_ == window_ && o->softcap_ == softcap_ && o->format_ == format_ &&
           o->has_recent_ == has_recent_ && o->has_sinks_ == has_sinks_;
  }

 private:
  float scale_;
  bool has_key_mask_;
  int64_t window_;
  float softcap_;
  CacheFormat format_;
  bool has_recent_;
  bool has_sinks_;
};

// A cache format the kernels read (Python's CacheFormat(kv_bits=,
// kv_group_size=, hadamard=), which a cache kind's native_format gives):
// float32 caches (kv_bits 0), or kv_bits 4 or 8 in groups of 32, 64 or 128.
CacheFormat make_cache_format(int kv_bits, int kv_group_size, bool hadamard) {
  const CacheFormat format{kv_bits, kv_group_size, hadamard};
  const std::string at = "mlxprog native CacheFormat: ";
  if (kv_bits != 0 && kv_bits != 4 && kv_bits != 8)
    throw std::invalid_argument(at + "kv_bits must be 0 (float caches), 4 or 8");
  if (hadamard && !format.quantized())
    throw std::invalid_argument(at + "hadamard is a quantized cache's setting");
  if (format.quantized() && kv_group_size != 32 && kv_group_size != 64 && kv_group_size != 128)
    throw std::invalid_argument(at + "kv_group_size must be 32, 64 or 128");
  return format;
}

// Check that `caches` are a cache of `format` (two float32 arrays, or six
// of a quantized cache); `where` names the caller.
void check_cache(const std::vector<mx::array>& caches, const CacheFormat& format,
                 const char* where) {
  const std::string at = std::string("mlxprog native ") + where + ": ";
  if (caches.size() != format.arrays())
    throw std::invalid_argument(at + (format.quantized()
                                          ? "a quantized cache is six arrays"
                                          : "a float cache is two arrays, k and v"));
  for (size_t i = 0; i < caches.size(); ++i)
    if (caches[i].ndim() != 4 ||
        caches[i].dtype() != (format.codes(i) ? mx::uint32 : mx::float32))
      throw std::invalid_argument(at + "cache arrays are [B, H_kv, S, ...], float32 (codes: "
                                  "uint32)");
}

// Check a quantized cache's recent ring (`ring`: k_recent, v_recent [B,
// H_kv, R, D] float32 and recent_slots [B, R] int32, R >= 1) against the
// cache whose first array is `k`; `where` names the caller.
void check_recent(const std::vector<mx::array>& ring, const mx::array& k,
                  const CacheFormat& format, const char* where) {
  const std::string at = std::string("mlxprog native ") + where + ": ";
  if (!format.quantized())
    throw std::invalid_argument(at + "a recent ring needs a quantized cache");
  if (ring.size() != 3)
    throw std::invalid_argument(at + "the recent ring is three arrays: k_recent, v_recent, "
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
                          float scale, int64_t window, float softcap, const CacheFormat& format,
                          std::optional<std::vector<mx::array>> recent,
                          std::optional<mx::array> sinks) {
  if (window < 0 || !(softcap >= 0.f))
    throw std::invalid_argument("cache_attention: window and softcap must be >= 0 (0: none)");
  check_cache(caches, format, "cache_attention");
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
  if (sinks) {
    if (sinks->ndim() != 1 || q.ndim() != 4 || sinks->shape(0) != q.shape(1) ||
        sinks->dtype() != mx::float32)
      throw std::invalid_argument("mlxprog native cache_attention: sinks must be float32 [H], "
                                  "one logit a query head");
    inputs.push_back(*sinks);
  }
  return mx::array(q.shape(), mx::float32,
                   std::make_shared<CacheAttention>(mx::default_stream(mx::Device::cpu), scale,
                                                    key_mask.has_value(), window, softcap,
                                                    format, recent.has_value(),
                                                    sinks.has_value()),
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

// The recent ring after the step (`ring`: k_recent, v_recent, recent_slots,
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

}  // namespace

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
  if (c.q_norm) {
    // Each head's D features normed in place (run_rms_norm reads a row
    // before it writes it).
    run_rms_norm(q.data(), c.q_norm, DType::f32, B * H * T, D, c.qk_norm_eps, q.data());
    run_rms_norm(k.data(), c.k_norm, DType::f32, B * H_kv * T, D, c.qk_norm_eps, k.data());
  }
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
  // them and the recent ring holds them.
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

BlockSettings block_settings(const std::vector<mx::array>& caches,
                             const std::optional<std::vector<mx::array>>& recent, int heads,
                             int kv_heads, int dims, bool traditional, float base,
                             float rope_scale, float scale, bool has_freqs, bool has_key_mask,
                             const CacheFormat& format,
                             const std::optional<std::vector<mx::array>>& qk_norm,
                             float qk_norm_eps, const char* where) {
  check_cache(caches, format, where);
  if (recent) check_recent(*recent, caches[0], format, where);
  if (qk_norm) {
    const mx::Shape head = {static_cast<int>(cache_head_dim(caches[0], format))};
    if (qk_norm->size() != 2 || (*qk_norm)[0].shape() != head || (*qk_norm)[1].shape() != head ||
        (*qk_norm)[0].dtype() != mx::float32 || (*qk_norm)[1].dtype() != mx::float32)
      throw std::invalid_argument(std::string("mlxprog native ") + where +
                                  ": qk_norm is q_norm and k_norm, float32 [D] (the caches' "
                                  "head dim)");
    if (!(qk_norm_eps >= 0.f))
      throw std::invalid_argument(std::string("mlxprog native ") + where +
                                  ": qk_norm_eps must be >= 0");
  }
  return {heads,        kv_heads, dims,   traditional,        base,
          rope_scale,   scale,    has_freqs, has_key_mask,    format,
          recent.has_value(), qk_norm.has_value(), qk_norm ? qk_norm_eps : 0.f};
}

std::vector<bool> share_caches(const std::vector<mx::array>& inputs, size_t first,
                               std::vector<mx::array>& outputs, const mx::Stream& stream) {
  std::vector<bool> shared(outputs.size() - 1);
  for (size_t i = 0; i < shared.size(); ++i)
    shared[i] = share_or_allocate(inputs[first + i], outputs[1 + i], outputs.size(), stream);
  return shared;
}

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
  block.q_norm = in.q_norm ? static_cast<const float*>(contiguous_data(*in.q_norm, scratch.q_norm))
                           : nullptr;
  block.k_norm = in.k_norm ? static_cast<const float*>(contiguous_data(*in.k_norm, scratch.k_norm))
                           : nullptr;
  block.qk_norm_eps = s.qk_norm_eps;
  return block;
}

std::vector<void*> cache_pointers(std::vector<mx::array>& cache_out) {
  std::vector<void*> pointers;
  for (mx::array& a : cache_out) pointers.push_back(a.data<void>());
  return pointers;
}

std::vector<mx::array> weak_caches(std::vector<mx::array>& outputs) {
  std::vector<mx::array> caches;
  for (size_t i = 1; i < outputs.size(); ++i)
    caches.push_back(mx::array::unsafe_weak_copy(outputs[i]));
  return caches;
}

std::vector<mx::array> block_inputs(std::vector<mx::array> inputs,
                                    const std::vector<mx::array>& carried,
                                    const mx::array& start, const mx::array& positions,
                                    const std::optional<mx::array>& freqs,
                                    const std::optional<mx::array>& key_mask,
                                    const std::optional<std::vector<mx::array>>& qk_norm) {
  inputs.insert(inputs.end(), carried.begin(), carried.end());
  inputs.push_back(start);
  inputs.push_back(positions);
  if (freqs) inputs.push_back(*freqs);
  if (key_mask) inputs.push_back(*key_mask);
  if (qk_norm) inputs.insert(inputs.end(), qk_norm->begin(), qk_norm->end());
  return inputs;
}

std::vector<mx::array> carried_arrays(const std::vector<mx::array>& caches,
                                      const std::optional<std::vector<mx::array>>& recent) {
  std::vector<mx::array> carried = caches;
  if (recent) carried.insert(carried.end(), recent->begin(), recent->end());
  return carried;
}

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

namespace {

class CacheAttentionBlock : public mx::Primitive {
 public:
  CacheAttentionBlock(mx::Stream stream, const BlockSettings& settings)
      : mx::Primitive(stream), settings_(settings) {}

  // inputs: qkv [B, T, (H + 2 H_kv) D] (float32), then the BlockOperands.
  // outputs: attention [B, T, H D], then the new cache arrays (and float
  // ring's).
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
                                             std::optional<mx::array> key_mask,
                                             const CacheFormat& format,
                                             std::optional<std::vector<mx::array>> recent,
                                             std::optional<std::vector<mx::array>> qk_norm,
                                             float qk_norm_eps) {
  const BlockSettings settings =
      block_settings(caches, recent, heads, kv_heads, dims, traditional, base, rope_scale,
                     scale, freqs.has_value(), key_mask.has_value(), format, qk_norm,
                     qk_norm_eps, "cache_attention_block");
  const mx::Shape out_shape = {
      qkv.shape(0), qkv.shape(1),
      heads * static_cast<int>(cache_head_dim(caches[0], settings.format))};
  const std::vector<mx::array> carried = carried_arrays(caches, recent);
  return make_block_outputs(
      out_shape, carried,
      std::make_shared<CacheAttentionBlock>(mx::default_stream(mx::Device::cpu), settings),
      block_inputs({qkv}, carried, start, positions, freqs, key_mask, qk_norm));
}

}  // namespace

void bind_attention(nb::module_& m) {
  nb::class_<CacheFormat>(m, "CacheFormat",
                          "A KV cache's format as the kernels read it: float32 keys and "
                          "values (kv_bits 0), or MLX's affine quantization of them (kv_bits 4 "
                          "or 8, groups of kv_group_size features; with hadamard, of each "
                          "group's Walsh-Hadamard transform, see hadamard). A cache kind's "
                          "native_format gives the fields (mlxprog/cache_kinds.py).")
      .def("__init__",
           [](CacheFormat* format, int kv_bits, int kv_group_size, bool hadamard) {
             new (format) CacheFormat(make_cache_format(kv_bits, kv_group_size, hadamard));
           },
           nb::kw_only(), nb::arg("kv_bits") = 0, nb::arg("kv_group_size") = 0,
           nb::arg("hadamard") = false)
      .def_ro("kv_bits", &CacheFormat::kv_bits)
      .def_ro("kv_group_size", &CacheFormat::kv_group_size)
      .def_ro("hadamard", &CacheFormat::hadamard);
  m.def("cache_attention", &cache_attention, nb::arg("q"), nb::arg("caches"),
        nb::arg("start"), nb::arg("key_mask").none() = nb::none(), nb::kw_only(),
        nb::arg("scale"), nb::arg("window") = 0, nb::arg("softcap") = 0.f,
        nb::arg("format") = CacheFormat{}, nb::arg("recent").none() = nb::none(),
        nb::arg("sinks").none() = nb::none(),
        "Attention of q [B, H, T, D] over a cache of `format` (a CacheFormat): caches = "
        "[k, v] ([B, H_kv, S, D] float32), or quantized the codes, scales and biases of k, "
        "then of v. Query t sees key j when "
        "j <= start + t, j > start + t - window (window > 0) and key_mask[b, j]; scores "
        "capped at softcap * tanh(s / softcap) when softcap > 0; a query that sees no key "
        "gets zeros. recent (a quantized cache's recent ring): [k_recent, v_recent "
        "[B, H_kv, R, D] float32, recent_slots [B, R] int32, new_k, new_v [B, H_kv, T, D] "
        "float32], all in the cache's basis: query t (slot p = start + t) reads key and "
        "value j with p - j < R from new_k/new_v (j >= start) or from the ring's entry "
        "j % R when recent_slots[b, j % R] == j, else dequantized. sinks (float32 [H]): "
        "head h's logit joins its queries' softmax denominators as a score of no value.");
  m.def("cache_attention_block", &cache_attention_block, nb::arg("qkv"),
        nb::arg("caches"), nb::arg("start"), nb::arg("positions"), nb::kw_only(),
        nb::arg("heads"), nb::arg("kv_heads"), nb::arg("dims"), nb::arg("traditional"),
        nb::arg("base"), nb::arg("rope_scale"), nb::arg("scale"),
        nb::arg("freqs").none() = nb::none(), nb::arg("key_mask").none() = nb::none(),
        nb::arg("format") = CacheFormat{}, nb::arg("recent").none() = nb::none(),
        nb::arg("qk_norm").none() = nb::none(), nb::arg("qk_norm_eps") = 0.f,
        "A fused attention block: q, k, v heads of qkv [B, T, (H + 2 H_kv) D] (with "
        "qk_norm [q_norm, k_norm], float32 [D] each: q and k heads RMS-normed by them, eps "
        "qk_norm_eps, as Qwen3 does), q and k rotated at positions[b] + t, k and v "
        "written into the cache (as cache_attention's "
        "caches; quantized as mx.quantize does) at slot start, attention as "
        "cache_attention; returns [out [B, T, H D], *caches]. recent: a quantized cache's "
        "recent ring [k_recent, v_recent, recent_slots] (as cache_attention's, the new "
        "rows being the block's own), read as cache_attention reads it; then, in each row, "
        "the new tokens among the R slots up to the row's last one key_mask keeps go into "
        "entry slot % R where the mask keeps them; returns [out, *caches, k_recent, "
        "v_recent, recent_slots].");
  m.def("hadamard", [](const mx::array& x, int group_size) {
        // For tests: the kernels' transform against the ops' MLX form.
        if (x.dtype() != mx::float32 || x.ndim() != 2 || group_size < 1 ||
            (group_size & (group_size - 1)) || x.shape(1) % group_size != 0)
          throw std::invalid_argument("hadamard: float32 [rows, D], group_size a power of two "
                                      "dividing D");
        mx::array xc = mx::contiguous(x);
        xc.eval();
        std::vector<float> out(xc.data<float>(), xc.data<float>() + x.size());
        active_kernels->hadamard(out.data(), static_cast<int64_t>(out.size()),
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
        quantize_rows(xc.data<float>(), rows, D, bits, group_size,
                               reinterpret_cast<uint8_t*>(codes.data()), scales.data(),
                               biases.data());
        return std::vector<mx::array>{
            mx::array(codes.begin(), {rows, D * bits / 32}, mx::uint32),
            mx::array(scales.begin(), {rows, groups}, mx::float32),
            mx::array(biases.begin(), {rows, groups}, mx::float32)};
      }, nb::arg("x"), nb::arg("bits"), nb::arg("group_size"),
      "MLX's affine quantization of the rows of x as the cache kernels write it: "
      "[codes, scales, biases] (for tests against mx.quantize).");
}

}  // namespace mlxprog
