// portable Q6_K (6.5625 bits/weight): per 256, an fp16 d; per 16, an int8
// scale; 6-bit codes q - 32 (four low bits in ql, two high bits in qh).
// w = (d * scale) * (q - 32).
#pragma once

#include "kquant_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// A block's 256 codes (-32..31) in element order. Each 128 elements take 64
// bytes of ql (element 32s + l: the low nibble of byte l (s = 0) or 32 + l
// (s = 1), the high nibble of the same bytes for s = 2, 3) and 32 bytes of
// qh (bits 2s..2s+1 of byte l).
inline void unpack_q6_k(const kquant::Q6K& b, int8_t codes[kquant::kBlock]) {
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = b.ql + 64 * half;
    const uint8_t* qh = b.qh + 32 * half;
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) {
        const int low = (ql[32 * (s % 2) + l] >> (4 * (s / 2))) & 0x0F;
        const int high = (qh[l] >> (2 * s)) & 3;
        codes[128 * half + 32 * s + l] = static_cast<int8_t>((low | high << 4) - 32);
      }
  }
}

// A row of Q6_K blocks to float32, as gguf computes it.
void dequantize_row_q6_k(const uint8_t* src, float* y, int64_t n) {
  const kquant::Q6K* blocks = reinterpret_cast<const kquant::Q6K*>(src);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    const float d = load_fp16(blocks[i].d);
    int8_t codes[kquant::kBlock];
    unpack_q6_k(blocks[i], codes);
    kquant::write_scaled(d, blocks[i].scales, 16, codes, y);
  }
}

// Q6_K row . q8_K row: per block d_w * d_x * sum scale * (q . q8).
float vec_dot_q6_k(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::Q6K* blocks = reinterpret_cast<const kquant::Q6K*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    int8_t codes[kquant::kBlock];
    unpack_q6_k(blocks[i], codes);
    const int32_t dot = kquant::scaled_dot(blocks[i].scales, 16, codes, x[i].qs);
    sum += x[i].d * load_fp16(blocks[i].d) * static_cast<float>(dot);
  }
  return sum;
}

// A row of Q6_K blocks in the int8 GEMM's form: codes q + 32 (0..63), each
// 16's scale, and its min -32 * scale (dm = d), so d * scale * (q + 32) +
// d * (-32 * scale) is the value.
void int8_unpack_row_q6_k(const uint8_t* src, void* dst, int64_t n) {
  const kquant::Q6K* blocks = reinterpret_cast<const kquant::Q6K*>(src);
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    unpack_q6_k(blocks[i], out[i].codes);
    for (int8_t& c : out[i].codes) c = static_cast<int8_t>(c + 32);
    kquant::set_q6_k_int8_groups(blocks[i], load_fp16(blocks[i].d), out[i]);
  }
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
