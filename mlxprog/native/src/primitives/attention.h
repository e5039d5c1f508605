// The KV cache and the attention block that a transformer layer builds on:
// the cache's format, an attention block's settings, operands and sizes, and
// run_attention_block with the helpers that carry a block's cache from step
// to step.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "primitive.h"

namespace mlxprog {

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
  CacheFormat format;           // (kernels.h)
  int64_t R;                    // a quantized cache's recent ring (RecentRows); 0: none
  // Per-head RMS norms of q and k before RoPE (Qwen3's q_norm, k_norm):
  // D float32 weights each, or null; eps theirs.
  const float* q_norm;
  const float* k_norm;
  float qk_norm_eps;
};

// The attributes of an attention block (a transformer layer has them too).
struct BlockSettings {
  int heads, kv_heads, dims;
  bool traditional;
  float base, rope_scale, scale;
  bool has_freqs, has_key_mask;
  CacheFormat format;
  bool has_recent;  // a quantized cache's recent ring (RecentRows)
  bool has_qk_norm;  // q and k RMS-normed per head before RoPE (q_norm, k_norm operands)
  float qk_norm_eps;

  // The arrays the block carries from step to step: the cache's, then the
  // recent ring's k_recent, v_recent and recent_slots.
  size_t carried() const { return format.arrays() + (has_recent ? 3 : 0); }

  bool operator==(const BlockSettings& o) const {
    return heads == o.heads && kv_heads == o.kv_heads && dims == o.dims &&
           traditional == o.traditional && base == o.base && rope_scale == o.rope_scale &&
           scale == o.scale && has_freqs == o.has_freqs && has_key_mask == o.has_key_mask &&
           format == o.format && has_recent == o.has_recent && has_qk_norm == o.has_qk_norm &&
           qk_norm_eps == o.qk_norm_eps;
  }
};

// An attention block's operands after qkv: the cache's arrays (two, or six
// of a quantized cache), with a recent ring its three arrays (`ring`),
// start (int32, one element: the clamped cache slot of token 0), positions
// (int32, one or B: the RoPE position of token 0), then freqs [dims / 2],
// key_mask [B, S] (bool), q_norm and k_norm [D] (float32) where the settings
// say; `first` is the index of the cache's first array.
struct BlockOperands {
  std::vector<mx::array> caches, ring;
  mx::array start, positions;
  std::optional<mx::array> freqs, key_mask, q_norm, k_norm;

  BlockOperands(const BlockSettings& s, const std::vector<mx::array>& inputs, size_t first)
      : caches(inputs.begin() + first, inputs.begin() + first + s.format.arrays()),
        ring(inputs.begin() + first + s.format.arrays(), inputs.begin() + first + s.carried()),
        start(inputs[first + s.carried()]),
        positions(inputs[first + s.carried() + 1]) {
    size_t next = first + s.carried() + 2;
    if (s.has_freqs) freqs = inputs[next++];
    if (s.has_key_mask) key_mask = inputs[next++];
    if (s.has_qk_norm) {
      q_norm = inputs[next++];
      k_norm = inputs[next++];
    }
  }
};

// Buffers that an AttentionBlock's pointers may point into.
struct BlockScratch {
  std::vector<uint8_t> start, positions, freqs, key_mask, q_norm, k_norm;
  std::vector<std::vector<uint8_t>> caches;
  std::vector<float> inv_freqs;
};

// From the fused projection qkv [B, T, (H + 2 H_kv) D]: q and k heads
// (RMS-normed per head first where c.q_norm is set) rotated, k and v
// written into the cache (`cache`: its arrays in set_cache's
// order, already holding the old entries; with a recent ring (c.R > 0) then
// k_recent, v_recent and recent_slots, holding the input ring, which the
// attention reads and update_recent then updates) at slot start, attention
// into out [B, T, H D].
void run_attention_block(const AttentionBlock& c, const float* x, void* const* cache,
                         float* out);

// The settings of an attention block (alone, or inside a transformer layer),
// its cache checked against its format (check_cache) and its recent ring, if
// any, against the cache (check_recent); `where` names the op.
BlockSettings block_settings(const std::vector<mx::array>& caches,
                             const std::optional<std::vector<mx::array>>& recent, int heads,
                             int kv_heads, int dims, bool traditional, float base,
                             float rope_scale, float scale, bool has_freqs, bool has_key_mask,
                             const CacheFormat& format,
                             const std::optional<std::vector<mx::array>>& qk_norm,
                             float qk_norm_eps, const char* where);

// Give each carried output (outputs[1..]: the cache's arrays, then the float
// ring's) the input's buffer where it may be donated (see
// share_or_allocate); which ones were shared.
std::vector<bool> share_caches(const std::vector<mx::array>& inputs, size_t first,
                               std::vector<mx::array>& outputs, const mx::Stream& stream);

// The outputs' carried arrays (`cache_out`: the cache's, then the float
// ring's), filled with the old ones where their buffers were not donated
// (`shared`), and the block's sizes and settings for T tokens.
AttentionBlock prepare_block(const BlockSettings& s, const BlockOperands& in, int64_t T,
                             const std::vector<bool>& shared, std::vector<mx::array>& cache_out,
                             BlockScratch& scratch);

// The writable data of the output caches, in set_cache's order, then of the
// recent ring's arrays.
std::vector<void*> cache_pointers(std::vector<mx::array>& cache_out);

// Weak copies of outputs[1..] (the carried arrays), for a task that fills them.
std::vector<mx::array> weak_caches(std::vector<mx::array>& outputs);

// `inputs` followed by the BlockOperands (`carried`: the cache's arrays,
// then the recent ring's; qk_norm: q_norm and k_norm, or none).
std::vector<mx::array> block_inputs(std::vector<mx::array> inputs,
                                    const std::vector<mx::array>& carried,
                                    const mx::array& start, const mx::array& positions,
                                    const std::optional<mx::array>& freqs,
                                    const std::optional<mx::array>& key_mask,
                                    const std::optional<std::vector<mx::array>>& qk_norm);

// The arrays a block carries: the cache's, then its recent ring's, if any.
std::vector<mx::array> carried_arrays(const std::vector<mx::array>& caches,
                                      const std::optional<std::vector<mx::array>>& recent);

// The shapes and dtypes of a block's outputs: `first` (the attention's or
// the layer's), then the carried arrays as they came in.
std::vector<mx::array> make_block_outputs(const mx::Shape& first,
                                          const std::vector<mx::array>& carried,
                                          std::shared_ptr<mx::Primitive> primitive,
                                          std::vector<mx::array> inputs);

}  // namespace mlxprog
