// portable IQ4_XS (4.25 bits/weight): per 256, an fp16 d; per 32, a 6-bit
// signed scale; 4-bit indices into the 16 non-linear levels kIq4Levels.
// w = (d * scale) * kIq4Levels[q].
#pragma once

#include "kquant_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A block's 256 levels in element order: each 32 elements are 16 bytes, the
// low nibbles the first 16, the high nibbles the next 16.
inline void unpack_iq4_xs(const kquant::IQ4XS& b, int8_t levels[kquant::kBlock]) {
  for (int sub = 0; sub < 8; ++sub)
    for (int l = 0; l < 16; ++l) {
      levels[32 * sub + l] = kIq4Levels[b.qs[16 * sub + l] & 0x0F];
      levels[32 * sub + 16 + l] = kIq4Levels[b.qs[16 * sub + l] >> 4];
    }
}

// A row of IQ4_XS blocks to float32, as gguf computes it.
void dequantize_row_iq4_xs(const uint8_t* src, float* y, int64_t n) {
  const kquant::IQ4XS* blocks = reinterpret_cast<const kquant::IQ4XS*>(src);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    const float d = load_fp16(blocks[i].d);
    int8_t scales[8], levels[kquant::kBlock];
    kquant::iq4_xs_scales(blocks[i], scales);
    unpack_iq4_xs(blocks[i], levels);
    kquant::write_scaled(d, scales, 8, levels, y);
  }
}

// IQ4_XS row . q8_K row: per block d_w * d_x * sum scale * (levels . q8).
float vec_dot_iq4_xs(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::IQ4XS* blocks = reinterpret_cast<const kquant::IQ4XS*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    int8_t scales[8], levels[kquant::kBlock];
    kquant::iq4_xs_scales(blocks[i], scales);
    unpack_iq4_xs(blocks[i], levels);
    const int32_t dot = kquant::scaled_dot(scales, 8, levels, x[i].qs);
    sum += x[i].d * load_fp16(blocks[i].d) * static_cast<float>(dot);
  }
  return sum;
}

// A row of IQ4_XS blocks in the int8 GEMM's form: the table values
// (signed), each 32's scale, no mins.
void int8_unpack_row_iq4_xs(const uint8_t* src, void* dst, int64_t n) {
  const kquant::IQ4XS* blocks = reinterpret_cast<const kquant::IQ4XS*>(src);
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    int8_t packed_scales[8];
    kquant::iq4_xs_scales(blocks[i], packed_scales);
    unpack_iq4_xs(blocks[i], out[i].codes);
    int scales[8], mins[8] = {};
    for (int s = 0; s < 8; ++s) scales[s] = packed_scales[s];
    kquant::set_int8_groups(scales, mins, 8, load_fp16(blocks[i].d), 0.0f, out[i]);
  }
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
