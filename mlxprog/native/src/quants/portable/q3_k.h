// portable Q3_K (3.4375 bits/weight): per 256, an fp16 d; per 16, a 6-bit
// signed scale; 3-bit codes q in -4..3 (two low bits, and a high bit that
// is set for the codes 0..3). w = (d * scale) * q.
#pragma once

#include "kquant_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A block's 256 codes (-4..3) in element order: the low two bits as Q2_K
// lays them out, the third bit of element 32k + l being bit k of hmask[l]
// (a clear bit subtracts 4).
inline void unpack_q3_k(const kquant::Q3K& b, int8_t codes[kquant::kBlock]) {
  for (int half = 0; half < 2; ++half)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) {
        const int group = 4 * half + s;
        const int low = (b.qs[32 * half + l] >> (2 * s)) & 3;
        const int high = (b.hmask[l] >> group) & 1;
        codes[32 * group + l] = static_cast<int8_t>(low - (high ? 0 : 4));
      }
}

// A row of Q3_K blocks to float32, as gguf computes it.
void dequantize_row_q3_k(const uint8_t* src, float* y, int64_t n) {
  const kquant::Q3K* blocks = reinterpret_cast<const kquant::Q3K*>(src);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    const float d = load_fp16(blocks[i].d);
    int8_t scales[16], codes[kquant::kBlock];
    kquant::q3_k_scales(blocks[i].scales, scales);
    unpack_q3_k(blocks[i], codes);
    kquant::write_scaled(d, scales, 16, codes, y);
  }
}

// Q3_K row . q8_K row: per block d_w * d_x * sum scale * (q . q8).
float vec_dot_q3_k(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::Q3K* blocks = reinterpret_cast<const kquant::Q3K*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    int8_t scales[16], codes[kquant::kBlock];
    kquant::q3_k_scales(blocks[i].scales, scales);
    unpack_q3_k(blocks[i], codes);
    const int32_t dot = kquant::scaled_dot(scales, 16, codes, x[i].qs);
    sum += x[i].d * load_fp16(blocks[i].d) * static_cast<float>(dot);
  }
  return sum;
}

// A row of Q3_K blocks in the int8 GEMM's form: codes q + 4 (0..7), each
// 16's scale, and its min -4 * scale (dm = d).
void int8_unpack_row_q3_k(const uint8_t* src, void* dst, int64_t n) {
  const kquant::Q3K* blocks = reinterpret_cast<const kquant::Q3K*>(src);
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    int8_t packed_scales[16];
    kquant::q3_k_scales(blocks[i].scales, packed_scales);
    unpack_q3_k(blocks[i], out[i].codes);
    for (int8_t& c : out[i].codes) c = static_cast<int8_t>(c + 4);
    int scales[16], mins[16];
    for (int g = 0; g < 16; ++g) scales[g] = packed_scales[g], mins[g] = -4 * scales[g];
    const float d = load_fp16(blocks[i].d);
    kquant::set_int8_groups(scales, mins, 16, d, d, out[i]);
  }
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
