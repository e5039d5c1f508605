// portable: attention over a KV cache (AttentionProblem), float or quantized.
// The algorithm (which keys a query sees, the capped and masked softmax, a
// quantized cache's blocks of dequantized keys and values and its float
// window) is written once, over the inner loops of a `Loops` type: the plain
// C++ AttentionLoops below, or x86/attention.h's AVX2 ones.
#pragma once

#include <cstring>
#include <memory>

#include "kernels/portable/hadamard.h"
#include "kernels/portable/vec.h"

namespace mlxprog {
namespace MLXPROG_ISA_NS {
namespace {
namespace portable {

struct AttentionLoops {
  // scores[j] = -inf for j < n where mask[j] is 0 (mask may be null);
  // returns the largest score that is not NaN (-inf if none) and sets `nan`
  // if some score is NaN.
  static float mask_and_top(float* scores, int64_t n, const uint8_t* mask, bool& nan);

  // scores[j] = exp(scores[j] - top) for j < n (masked scores are -inf: 0);
  // returns their sum.
  static float softmax_numerators(float* scores, int64_t n, float top);

  // out = sum_j w[j] * rows[j] over n rows of D floats (zero weights
  // skipped), or with `accumulate` out += that sum. The output is kept in
  // registers 64 floats at a time, so consecutive rows do not wait on each
  // other's stores.
  static void weighted_rows(const float* w, const float* rows, int64_t n, int64_t D, float* out,
                            bool accumulate = false);

  // dots[j] = dot(q, keys[j]) * scale for j < n.
  static void key_scores(const float* q, const float* keys, int64_t n, int64_t D, float scale,
                         float* dots);

  // Two queries q0, q1 (D floats each) against the first n0 and n1 >= n0
  // of the same keys: key_scores of each into dots0 and dots1, with the same
  // values (a vector version reads the shared keys once for both).
  static void key_scores_pair(const float* q0, const float* q1, const float* keys, int64_t n0,
                              int64_t n1, int64_t D, float scale, float* dots0, float* dots1);

  // weighted_rows of two queries' weights w0 (n0 of them) and w1 (n1 >= n0)
  // over the same rows into out0 and out1 (or with `accumulate` added to
  // them), with the same values (a vector version reads the shared rows
  // once for both).
  static void weighted_rows_pair(const float* w0, const float* w1, const float* rows,
                                 int64_t n0, int64_t n1, int64_t D, float* out0, float* out1,
                                 bool accumulate);

  // Rows [row0, row0 + n) of a quantized cache of D features a row (`bits`
  // wide codes, groups of `group_size`) as floats, scale * code + bias, into
  // out (n x D).
  static void dequantize_rows(const QuantizedRows& c, int bits, int64_t group_size, int64_t D,
                              int64_t row0, int64_t n, float* out);
};

float AttentionLoops::mask_and_top(float* scores, int64_t n, const uint8_t* mask, bool& nan) {
  float top = -__builtin_inff();
  for (int64_t j = 0; j < n; ++j) {
    if (mask && !mask[j]) scores[j] = -__builtin_inff();
    nan |= scores[j] != scores[j];
    top = scores[j] > top ? scores[j] : top;
  }
  return top;
}

float AttentionLoops::softmax_numerators(float* scores, int64_t n, float top) {
  float total = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    const float e = scores[j] == -__builtin_inff() ? 0.f : __builtin_expf(scores[j] - top);
    scores[j] = e;
    total += e;
  }
  return total;
}

void AttentionLoops::weighted_rows(const float* w, const float* rows, int64_t n, int64_t D,
                                   float* out, bool accumulate) {
  for (int64_t d0 = 0; d0 < D; d0 += 64) {
    const int64_t width = imin(64, D - d0);
    float acc[64];
    for (int64_t d = 0; d < width; ++d) acc[d] = accumulate ? out[d0 + d] : 0.f;
    for (int64_t j = 0; j < n; ++j) {
      if (w[j] == 0.f) continue;
      const float* r = rows + j * D + d0;
      for (int64_t d = 0; d < width; ++d) acc[d] += w[j] * r[d];
    }
    for (int64_t d = 0; d < width; ++d) out[d0 + d] = acc[d];
  }
}

void AttentionLoops::key_scores(const float* q, const float* keys, int64_t n, int64_t D,
                                float scale, float* dots) {
  for (int64_t j = 0; j < n; ++j) dots[j] = Vec::dot(q, keys + j * D, D) * scale;
}

void AttentionLoops::key_scores_pair(const float* q0, const float* q1, const float* keys,
                                     int64_t n0, int64_t n1, int64_t D, float scale,
                                     float* dots0, float* dots1) {
  key_scores(q0, keys, n0, D, scale, dots0);
  key_scores(q1, keys, n1, D, scale, dots1);
}

void AttentionLoops::weighted_rows_pair(const float* w0, const float* w1, const float* rows,
                                        int64_t n0, int64_t n1, int64_t D, float* out0,
                                        float* out1, bool accumulate) {
  weighted_rows(w0, rows, n0, D, out0, accumulate);
  weighted_rows(w1, rows, n1, D, out1, accumulate);
}

void AttentionLoops::dequantize_rows(const QuantizedRows& c, int bits, int64_t group_size,
                                     int64_t D, int64_t row0, int64_t n, float* out) {
  const int64_t row_bytes = D * bits / 8, groups = D / group_size;
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* codes = c.codes + (row0 + r) * row_bytes;
    const float* scales = c.scales + (row0 + r) * groups;
    const float* biases = c.biases + (row0 + r) * groups;
    float* row = out + r * D;
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* src = codes + g * group_size * bits / 8;
      float* dst = row + g * group_size;
      const float scale = scales[g], bias = biases[g];
      for (int64_t i = 0; i < group_size; ++i) {
        const int code = bits == 8 ? src[i] : (src[i / 2] >> (4 * (i % 2))) & 0x0F;
        dst[i] = scale * static_cast<float>(code) + bias;
      }
    }
  }
}

// What a query saw: keys (its scores are now softmax weights), no key at
// all (its output is zeros), or a NaN or +inf score (NaN, as a softmax
// over them gives).
enum class Seen { keys, nothing, nan };

// A query's n raw scores (q . k * scale) made into its attention weights in
// place: capped (softcap), masked (key_mask; -inf), softmaxed, with the
// head's sink logit (`sink`, or null) one more term of the denominator.
template <class Loops>
Seen attention_weights(const AttentionProblem& p, float* scores, int64_t n,
                       const uint8_t* mask, const float* sink) {
  if (p.softcap > 0.f)
    for (int64_t j = 0; j < n; ++j) scores[j] = p.softcap * __builtin_tanhf(scores[j] / p.softcap);
  bool nan = false;
  float top = Loops::mask_and_top(scores, n, mask, nan);
  if (nan || top == __builtin_inff()) return Seen::nan;
  if (top == -__builtin_inff()) return Seen::nothing;
  if (sink) {
    if (*sink != *sink || *sink == __builtin_inff()) return Seen::nan;
    top = *sink > top ? *sink : top;
  }
  float total = Loops::softmax_numerators(scores, n, top);
  if (sink) total += __builtin_expf(*sink - top);
  const float norm = 1.f / total;
  for (int64_t j = 0; j < n; ++j) scores[j] *= norm;
  return Seen::keys;
}

// A query's output from its attention weights `w` over n keys (`seen` as
// attention_weights said): the weighted sum of its value rows v, zeros, or
// NaN.
template <class Loops>
void finish_query(Seen seen, const float* w, const float* v, int64_t n, int64_t D, float* out) {
  switch (seen) {
    case Seen::nan:
      for (int64_t d = 0; d < D; ++d) out[d] = __builtin_nanf("");
      break;
    case Seen::nothing:
      for (int64_t d = 0; d < D; ++d) out[d] = 0.f;
      break;
    case Seen::keys:
      Loops::weighted_rows(w, v, n, D, out);
  }
}

// Keys (and value rows) a block of queries goes through at a time: 16 KB
// of each at D = 64, in L1 while every query of the block uses them. A
// multiple of four, so each query's scores group keys as key_scores alone
// does.
constexpr int64_t kKeyBlock = 64;

// Queries [0, count) of a block (count <= kAttentionQueryBlock): query r
// (q + r * D, out + r * D) sees keys [0, n[r]) of k and v, n ascending.
// Each block of kKeyBlock keys is scored for every query, consecutive
// queries in pairs (each key read once for both), then each query's scores
// are made weights, then each block of value rows is summed into every
// query's output. A query's scores and sums are computed as key_scores and
// weighted_rows compute them alone (the sums continue from the stored
// partial sums), so its output is the bits it gets alone.
template <class Loops>
void attention_block(const AttentionProblem& p, const float* q, const float* k, const float* v,
                     const int64_t* n, int64_t count, const uint8_t* mask, const float* sink,
                     float* scores, int64_t stride, float* out) {
  const int64_t D = p.D, last = n[count - 1];
  // Keys [j0, j0 + kKeyBlock) that query r sees.
  auto seen_in = [&](int64_t r, int64_t j0) { return imax(0, imin(kKeyBlock, n[r] - j0)); };
  for (int64_t j0 = 0; j0 < last; j0 += kKeyBlock)
    for (int64_t r = 0; r < count; r += 2) {
      if (r + 1 < count)
        Loops::key_scores_pair(q + r * D, q + (r + 1) * D, k + j0 * D, seen_in(r, j0),
                               seen_in(r + 1, j0), D, p.scale, scores + r * stride + j0,
                               scores + (r + 1) * stride + j0);
      else
        Loops::key_scores(q + r * D, k + j0 * D, seen_in(r, j0), D, p.scale,
                          scores + r * stride + j0);
    }
  Seen seen[kAttentionQueryBlock];
  for (int64_t r = 0; r < count; ++r) {
    seen[r] = attention_weights<Loops>(p, scores + r * stride, n[r], mask, sink);
    if (seen[r] != Seen::keys) finish_query<Loops>(seen[r], nullptr, v, 0, D, out + r * D);
  }
  for (int64_t j0 = 0; j0 < last; j0 += kKeyBlock)
    for (int64_t r = 0; r < count;) {
      const bool pair = r + 1 < count && seen[r] == Seen::keys && seen[r + 1] == Seen::keys;
      if (pair) {
        Loops::weighted_rows_pair(scores + r * stride + j0, scores + (r + 1) * stride + j0,
                                  v + j0 * D, seen_in(r, j0), seen_in(r + 1, j0), D,
                                  out + r * D, out + (r + 1) * D, j0 > 0);
        r += 2;
        continue;
      }
      if (seen[r] == Seen::keys && seen_in(r, j0) > 0)
        Loops::weighted_rows(scores + r * stride + j0, v + j0 * D, seen_in(r, j0), D,
                             out + r * D, j0 > 0);
      ++r;
    }
}

// Query rows [i0, i1), a row being (batch, head, query position). Without a
// sliding window, a head's consecutive positions (up to
// kAttentionQueryBlock) are computed together (attention_block); with one,
// each query alone from its window's first key.
template <class Loops>
void attention(const AttentionProblem& p, int64_t i0, int64_t i1) {
  const int64_t S = p.S, D = p.D, group = p.H / p.H_kv;
  // Keys after the last query's position are never seen.
  const int64_t visible_end = imin(S, p.start + p.T);
  const int64_t stride = visible_end > 0 ? visible_end : 1;
  // The block's scores, in a buffer each thread keeps between calls: a
  // block's 64 KB (at 1,024 keys) allocated and freed a call went back to
  // the system and faulted in again page by page, every call.
  thread_local std::unique_ptr<float[]> kept;
  thread_local int64_t kept_size = 0;
  if (kept_size < kAttentionQueryBlock * stride) {
    kept_size = kAttentionQueryBlock * stride;
    kept.reset(new float[kept_size]);
  }
  float* scores = kept.get();
  for (int64_t i = i0; i < i1;) {
    const int64_t t = i % p.T, h = (i / p.T) % p.H, b = i / (p.T * p.H), kv = h / group;
    const float* k = p.k + (b * p.H_kv + kv) * S * D;
    const float* v = p.v + (b * p.H_kv + kv) * S * D;
    const uint8_t* mask = p.key_mask ? p.key_mask + b * S : nullptr;
    const float* sink = p.sinks ? p.sinks + h : nullptr;
    if (p.window <= 0) {
      const int64_t count = imin(kAttentionQueryBlock, imin(i1 - i, p.T - t));
      int64_t n[kAttentionQueryBlock];
      for (int64_t r = 0; r < count; ++r) n[r] = imin(S, p.start + t + r + 1);
      attention_block<Loops>(p, p.q + i * D, k, v, n, count, mask, sink, scores, stride,
                             p.out + i * D);
      i += count;
      continue;
    }
    // The window's first key: keys before it are not scored at all.
    const int64_t end = imin(S, p.start + t + 1);
    const int64_t first = p.start + t + 1 - p.window;
    const int64_t begin = first > 0 ? first : 0;
    const int64_t n = end > begin ? end - begin : 0;
    Loops::key_scores(p.q + i * D, k + begin * D, n, D, p.scale, scores);
    finish_query<Loops>(attention_weights<Loops>(p, scores, n, mask ? mask + begin : nullptr,
                                                 sink),
                        scores, v + begin * D, n, D, p.out + i * D);
    ++i;
  }
}

// Put into `rows` (the dequantized rows of slots [slot0, slot0 + n) of batch
// b, KV head kv: keys, or values with `values`) the rows that the query at
// slot `pos` reads from the recent ring instead (RecentRows): only slots of
// the last R up to pos can differ, so the loop visits at most R.
void read_recent(const AttentionProblem& p, bool values, int64_t b, int64_t kv, int64_t pos,
                 int64_t slot0, int64_t n, float* rows) {
  const RecentRows& r = p.recent;
  const int64_t D = p.D, head = b * p.H_kv + kv;
  for (int64_t j = imax(slot0, pos - r.R + 1); j < imin(slot0 + n, pos + 1); ++j) {
    const float* row = nullptr;
    if (j >= p.start)  // written this step: the cache holds it rounded
      row = (values ? r.new_v : r.new_k) + (head * p.T + j - p.start) * D;
    else if (r.slots[b * r.R + j % r.R] == j)
      row = (values ? r.v_recent : r.k_recent) + (head * r.R + j % r.R) * D;
    if (row) std::memcpy(rows + (j - slot0) * D, row, D * sizeof(float));
  }
}

// One work item per (batch, KV head, query position): the group's query
// heads at that position see the same keys, so each block of keys and of
// values is dequantized once for all of them (into L1-sized scratch), the
// recent ring's rows put in, then scored and summed as the float kernel does.
template <class Loops>
void attention_quantized(const AttentionProblem& p, int64_t i0, int64_t i1) {
  constexpr int64_t kBlock = 64;  // keys dequantized at a time
  const int64_t S = p.S, D = p.D, group = p.H / p.H_kv;
  const int64_t visible_end = imin(S, p.start + p.T);
  const CacheFormat& format = p.format;
  // Raw arrays: a std::vector would be instantiated in every table's copy.
  float* scores = new float[group * (visible_end > 0 ? visible_end : 1)];
  float* rows = new float[kBlock * D];
  float* queries = new float[group * D];  // the group's queries, transformed with hadamard
  Seen* seen = new Seen[group];
  // 1 / group_size is a power of two: scaling by it rounds nothing.
  const float unscale = format.hadamard ? 1.f / static_cast<float>(format.kv_group_size) : 1.f;
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t t = i % p.T, kv = (i / p.T) % p.H_kv, b = i / (p.T * p.H_kv);
    const int64_t end = imin(S, p.start + t + 1);
    const int64_t first = p.window > 0 ? p.start + t + 1 - p.window : 0;
    const int64_t begin = first > 0 ? first : 0;
    const int64_t n = end > begin ? end - begin : 0;
    const int64_t row0 = (b * p.H_kv + kv) * S + begin;  // the first visible slot's row
    const uint8_t* mask = p.key_mask ? p.key_mask + b * S + begin : nullptr;
    auto query = [&](int64_t g) { return ((b * p.H + kv * group + g) * p.T + t) * D; };
    for (int64_t g = 0; g < group; ++g) {
      float* q = queries + g * D;
      std::memcpy(q, p.q + query(g), D * sizeof(float));
      if (format.hadamard) {
        hadamard(q, D, format.kv_group_size);
        for (int64_t d = 0; d < D; ++d) q[d] *= unscale;
      }
    }
    for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
      const int64_t count = imin(kBlock, n - j0);
      Loops::dequantize_rows(p.k_quantized, format.kv_bits, format.kv_group_size, D, row0 + j0,
                             count, rows);
      if (p.recent.R > 0)
        read_recent(p, false, b, kv, p.start + t, begin + j0, count, rows);
      for (int64_t g = 0; g < group; ++g)
        Loops::key_scores(queries + g * D, rows, count, D, p.scale, &scores[g * n + j0]);
    }
    for (int64_t g = 0; g < group; ++g) {
      seen[g] = attention_weights<Loops>(p, &scores[g * n], n, mask,
                                        p.sinks ? p.sinks + kv * group + g : nullptr);
      float* out = p.out + query(g);
      const float fill = seen[g] == Seen::nan ? __builtin_nanf("") : 0.f;
      for (int64_t d = 0; d < D; ++d) out[d] = fill;
    }
    for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
      const int64_t count = imin(kBlock, n - j0);
      Loops::dequantize_rows(p.v_quantized, format.kv_bits, format.kv_group_size, D, row0 + j0,
                             count, rows);
      if (p.recent.R > 0)
        read_recent(p, true, b, kv, p.start + t, begin + j0, count, rows);
      for (int64_t g = 0; g < group; ++g)
        if (seen[g] == Seen::keys)
          Loops::weighted_rows(&scores[g * n + j0], rows, count, D, p.out + query(g), true);
    }
    if (format.hadamard)  // the weighted sum of transformed values, transformed back
      for (int64_t g = 0; g < group; ++g)
        if (seen[g] == Seen::keys) {
          float* out = p.out + query(g);
          hadamard(out, D, format.kv_group_size);
          for (int64_t d = 0; d < D; ++d) out[d] *= unscale;
        }
  }
  delete[] scores;
  delete[] rows;
  delete[] queries;
  delete[] seen;
}

}  // namespace portable
}  // namespace
}  // namespace MLXPROG_ISA_NS
}  // namespace mlxprog
