// x86 IQ4_XS (AVX2): per 256, an fp16 d; per 32, a 6-bit signed scale;
// 4-bit indices into the 16 non-linear levels kIq4Levels.
// w = (d * scale) * kIq4Levels[q].
#pragma once

#include "kquant_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The levels of sub-blocks 2 * pair and 2 * pair + 1 of an IQ4_XS block as
// 32 int8 each (each sub-block is 16 bytes of qs: low nibbles the first 16
// elements, high nibbles the next 16). table: kIq4Levels in both lanes.
[[gnu::always_inline]] inline void iq4_xs_levels(const kquant::IQ4XS& b, int pair, __m256i table,
                                                 __m256i levels[2]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i q = kquant::load_256(b.qs + 32 * pair);  // a sub-block per lane
  const __m256i low = _mm256_and_si256(q, low4),
                high = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
  levels[0] = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(low, high, 0x20));
  levels[1] = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(low, high, 0x31));
}

// kIq4Levels in both lanes (the pshufb table of iq4_xs_levels).
[[gnu::always_inline]] inline __m256i iq4_xs_table() {
  return _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Levels)));
}

// An IQ4_XS block's eight scales (-32..31) as the low int16 of eight int32.
[[gnu::always_inline]] inline __m256i iq4_xs_scales_epi32(const kquant::IQ4XS& b) {
  const int low = static_cast<int>(kquant::load_u32(b.scales_l));
  const int high = b.scales_h[0] | b.scales_h[1] << 8;
  const __m256i low_bits = _mm256_and_si256(
      _mm256_srlv_epi32(_mm256_set1_epi32(low), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
      _mm256_set1_epi32(0x0F));
  const __m256i high_bits = _mm256_and_si256(
      _mm256_srlv_epi32(_mm256_set1_epi32(high), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
      _mm256_set1_epi32(3));
  return _mm256_sub_epi32(_mm256_or_si256(low_bits, _mm256_slli_epi32(high_bits, 4)),
                          _mm256_set1_epi32(32));
}

// A row of IQ4_XS blocks to float32, as gguf computes it.
void dequantize_row_iq4_xs(const uint8_t* src, float* y, int64_t n) {
  const kquant::IQ4XS* blocks = reinterpret_cast<const kquant::IQ4XS*>(src);
  const __m256i table = iq4_xs_table();
  for (int64_t i = 0; i < n / kquant::kBlock; ++i, y += kquant::kBlock) {
    const float d = kquant::fp16_at(blocks[i].d);
    int8_t scales[8];
    kquant::iq4_xs_scales(blocks[i], scales);
#pragma GCC unroll 16
    for (int pair = 0; pair < 4; ++pair) {
      __m256i levels[2];
      iq4_xs_levels(blocks[i], pair, table, levels);
#pragma GCC unroll 16
      for (int k = 0; k < 2; ++k) {
        const int sub = 2 * pair + k;
        const float scale = d * static_cast<float>(scales[sub]);
        kquant::store_scaled(y + 32 * sub, levels[k], scale, scale);
      }
    }
  }
}

// IQ4_XS row . q8_K row: per block d_w * d_x * sum scale * (levels . q8).
// The levels are signed: their magnitudes go to vpmaddubsw's unsigned side
// and their signs onto the q8 codes (|level| <= 127 and |q8| <= 127 keep the
// int16 pair sums from saturating).
float vec_dot_iq4_xs(int64_t n, const uint8_t* w, const void* xv) {
  const kquant::IQ4XS* blocks = reinterpret_cast<const kquant::IQ4XS*>(w);
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  const __m256i table = iq4_xs_table();
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
    const __m256i scales = iq4_xs_scales_epi32(blocks[i]);
    const __m256i halves[2] = {_mm256_permute2x128_si256(scales, scales, 0x00),
                               _mm256_permute2x128_si256(scales, scales, 0x11)};
    __m256i dot[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 16
    for (int pair = 0; pair < 4; ++pair) {
      __m256i levels[2];
      iq4_xs_levels(blocks[i], pair, table, levels);
#pragma GCC unroll 16
      for (int k = 0; k < 2; ++k) {
        const int sub = 2 * pair + k;
        const __m256i q8 = kquant::load_256(x[i].qs + 32 * sub);
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(levels[k], levels[k]),
                                                   _mm256_sign_epi8(q8, levels[k]));
        // Scale `sub` is the low int16 of int32 lane sub % 4 of its half.
        const __m256i scale =
            _mm256_shuffle_epi8(halves[sub / 4], kquant::scale_mask(2 * (sub % 4)));
        dot[k] = kquant::madd_add_epi16(dot[k], pairs, scale);
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * kquant::fp16_at(blocks[i].d)),
                          _mm256_cvtepi32_ps(_mm256_add_epi32(dot[0], dot[1])), acc);
  }
  return hsum_ps(acc);
}

// A row of IQ4_XS blocks in the int8 GEMM's form, the bytes the portable
// unpacker writes (tested equal): the levels (signed) by table lookups, a
// vector store per 32, each 32's scale, no mins. The portable unpacker's
// lookups byte by byte made the int8 GEMM slower than the exact path.
void int8_unpack_row_iq4_xs(const uint8_t* src, void* dst, int64_t n) {
  const kquant::IQ4XS* blocks = reinterpret_cast<const kquant::IQ4XS*>(src);
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  const __m256i table = iq4_xs_table();
  for (int64_t i = 0; i < n / kquant::kBlock; ++i) {
#pragma GCC unroll 4
    for (int pair = 0; pair < 4; ++pair) {
      __m256i levels[2];
      iq4_xs_levels(blocks[i], pair, table, levels);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[i].codes + 64 * pair), levels[0]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[i].codes + 64 * pair + 32), levels[1]);
    }
    int8_t packed_scales[8];
    kquant::iq4_xs_scales(blocks[i], packed_scales);
    int scales[8], mins[8] = {};
    for (int s = 0; s < 8; ++s) scales[s] = packed_scales[s];
    kquant::set_int8_groups(scales, mins, 8, kquant::fp16_at(blocks[i].d), 0.0f, out[i]);
  }
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
