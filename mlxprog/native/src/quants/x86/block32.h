// x86: what the 32-element block types share (AVX2). A block's 32 codes are
// unpacked into one 256-bit vector of bytes; its integer dot with the q8
// block is eight int32 partial sums, which are converted once and
// multiply-added with the block's scale into float accumulators: one
// horizontal sum per row.
#pragma once

#include <type_traits>

#include "../portable/block32.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
// Names live in the nested namespace `block32`: other groups' helpers share
// the enclosing namespace in the same table file.
namespace block32 {

// The little-endian fp16 at p as float (F16C).
inline float fp16_scale(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// fp16_scale as a function object: a template given it inlines the call,
// where a function pointer argument can stay an indirect call per block.
struct Fp16Scale {
  float operator()(const uint8_t* p) const { return fp16_scale(p); }
};

// v with `value` or-ed into byte j where bit j of the little-endian uint32
// at p is set (where_set) or clear (!where_set): the fifth bits of Q5_0 and
// Q5_1. With AVX512BW+VL one masked byte add (the same as or: v's bytes are
// nibbles, `value`'s low nibble is 0); with AVX2 the bits are spread to
// bytes (byte j takes byte j / 8 of the word, then tests bit j % 8).
template <bool where_set>
inline __m256i or_where_bits(__m256i v, const uint8_t* p, int8_t value) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  return _mm256_mask_add_epi8(v, _cvtu32_mask32(where_set ? bits : ~bits), v,
                              _mm256_set1_epi8(value));
#else
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  const __m256i fill = _mm256_set1_epi8(value);
  return _mm256_or_si256(v,
                         where_set ? _mm256_and_si256(set, fill) : _mm256_andnot_si256(set, fill));
#endif
}

// A 16-entry int8 table (in both 128-bit lanes) for _mm256_shuffle_epi8.
inline __m256i byte_table_16(const int8_t* values) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values)));
}

// p itself, but opaque to the compiler, so that a product passed through
// here is rounded before a later add instead of fused into an FMA (gguf
// rounds d * q, then adds m).
inline __m256 rounded_product(__m256 p) {
  __asm__("" : "+x"(p));
  return p;
}

// Writes the 32 int8 codes times d (x8 per store) to y, plus m when
// with_min (d * code rounded first), as gguf computes it.
template <bool with_min>
inline void store_scaled_codes(__m256i codes, __m256 d, __m256 m, float* y) {
  const __m128i low = _mm256_castsi256_si128(codes), high = _mm256_extracti128_si256(codes, 1);
  const __m128i eights[4] = {low, _mm_srli_si128(low, 8), high, _mm_srli_si128(high, 8)};
  for (int k = 0; k < 4; ++k) {
    const __m256 product = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eights[k])));
    _mm256_storeu_ps(y + 8 * k, with_min ? _mm256_add_ps(rounded_product(product), m) : product);
  }
}

// A row of blocks of kBytes to float32: codes(block) the 32 signed codes as
// bytes, scale(block) the float they are multiplied by.
template <int kBytes, typename Codes, typename Scale>
inline void dequantize_blocks(const uint8_t* src, float* y, int64_t n, Codes codes, Scale scale) {
  for (int64_t i = 0; i < n / kBlock32; ++i, src += kBytes, y += kBlock32)
    store_scaled_codes<false>(codes(src), _mm256_set1_ps(scale(src)), _mm256_setzero_ps(), y);
}

// A row's dot product with q8_0 blocks for types whose codes are signed
// bytes (any value: |-128| is 128 as an unsigned byte, and the q8 codes
// stay within +-127, so no int16 pair sum saturates): per block, the
// signed byte dot of codes(block) with the q8 codes, scaled by
// scale(block) * d_x. Two blocks a step into two accumulators (the FMA
// latency, not the integer work, would bound one chain).
template <int kBytes, typename Codes, typename Scale>
inline float dot_signed_blocks(int64_t n, const uint8_t* w, const BlockQ8_0* x, Codes codes,
                               Scale scale) {
  const int64_t blocks = n / kBlock32;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 1 < blocks; i += 2, w += 2 * kBytes) {
    const __m256i dot0 =
        dot_s8s8(codes(w), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs)));
    const __m256i dot1 = dot_s8s8(
        codes(w + kBytes), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i + 1].qs)));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(scale(w) * x[i].d), _mm256_cvtepi32_ps(dot0), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(scale(w + kBytes) * x[i + 1].d), _mm256_cvtepi32_ps(dot1),
                           acc1);
  }
  if (i < blocks) {
    const __m256i dot =
        dot_s8s8(codes(w), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs)));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(scale(w) * x[i].d), _mm256_cvtepi32_ps(dot), acc0);
  }
  return hsum_ps(_mm256_add_ps(acc0, acc1));
}

// The scales of block `offset` (its byte offset) of four rows, as scale(block)
// gives each: for fp16 scales, the four halves gathered into one register
// and converted together, one vector instruction where four scalar
// conversions and broadcasts took twelve.
template <typename Scale>
inline __m128 row_scales_4(const uint8_t* const* rows, int64_t offset, Scale scale) {
  if constexpr (std::is_same_v<Scale, Fp16Scale>) {
    uint64_t halves = 0;
    for (int r = 0; r < 4; ++r) {
      uint16_t h;
      std::memcpy(&h, rows[r] + offset, 2);
      halves |= static_cast<uint64_t>(h) << (16 * r);
    }
    return _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(halves)));
  } else {
    return _mm_setr_ps(scale(rows[0] + offset), scale(rows[1] + offset),
                       scale(rows[2] + offset), scale(rows[3] + offset));
  }
}

// dot_signed_blocks for four rows at once (row r at w + r * row_bytes):
// out[r] is bit for bit what dot_signed_blocks gives for that row (each row
// keeps its own two accumulators and the same operations in the same
// order), while the activation blocks are loaded once for the four rows and
// the rows' work interleaves. What depends on x alone is done once per block
// for the four rows: with kOffset == 0, x's signs are moved onto the codes
// (|x| . (codes * sign x), the same int32 sums as the signed product, one
// instruction a row fewer than moving the codes' signs onto x); with
// kOffset > 0 codes(block) are unsigned and the signed codes are codes -
// kOffset (Q4_0, Q5_0): the integer dot is codes . x - kOffset * (sums of
// x). The four rows' scale products d_w * d_x are one vector multiply,
// stored and broadcast to each row's multiply-add from memory: a load each,
// where a lane permute took the shuffle unit that unpacking the codes needs
// (7-9% less time a block for Q4_0, Q5_0, IQ4_NL and MXFP4).
template <int kBytes, int kOffset, typename Codes, typename Scale>
inline void dot_signed_blocks_x4(int64_t n, const uint8_t* w, int64_t row_bytes,
                                 const BlockQ8_0* x, Codes codes, Scale scale, float* out) {
  const int64_t blocks = n / kBlock32;
  const uint8_t* rows[4] = {w, w + row_bytes, w + 2 * row_bytes, w + 3 * row_bytes};
  __m256 acc0[4], acc1[4];
  for (int r = 0; r < 4; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  // Row r's term for block i: its integer dot with x's block (xq its codes;
  // x_term |xq| or kOffset times xq's partial sums) times both scales.
  auto add_block = [&](__m256 acc, int r, int64_t i, __m256i xq, __m256i x_term,
                       const float* scales) {
    const uint8_t* block = rows[r] + i * kBytes;
    __m256i dot;
    if constexpr (kOffset == 0)
      dot = dot_u8s8_add(_mm256_setzero_si256(), x_term, _mm256_sign_epi8(codes(block), xq));
    else
      dot = _mm256_sub_epi32(dot_u8s8_add(_mm256_setzero_si256(), codes(block), xq), x_term);
    return _mm256_fmadd_ps(_mm256_broadcast_ss(scales + r), _mm256_cvtepi32_ps(dot), acc);
  };
  auto x_term_of = [](__m256i xq) {
    if constexpr (kOffset == 0)
      return _mm256_abs_epi8(xq);
    else
      return dot_u8s8_add(_mm256_setzero_si256(), _mm256_set1_epi8(kOffset), xq);
  };
  auto scales_of = [&](int64_t i) {
    return _mm_mul_ps(row_scales_4(rows, i * kBytes, scale), _mm_set1_ps(x[i].d));
  };
  int64_t i = 0;
  for (; i + 1 < blocks; i += 2) {
    const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs));
    const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i + 1].qs));
    const __m256i term0 = x_term_of(x0), term1 = x_term_of(x1);
    alignas(16) float scales0[4], scales1[4];
    _mm_store_ps(scales0, scales_of(i));
    _mm_store_ps(scales1, scales_of(i + 1));
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      acc0[r] = add_block(acc0[r], r, i, x0, term0, scales0);
      acc1[r] = add_block(acc1[r], r, i + 1, x1, term1, scales1);
    }
  }
  if (i < blocks) {
    const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs));
    const __m256i term0 = x_term_of(x0);
    alignas(16) float scales0[4];
    _mm_store_ps(scales0, scales_of(i));
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) acc0[r] = add_block(acc0[r], r, i, x0, term0, scales0);
  }
  for (int r = 0; r < 4; ++r) out[r] = hsum_ps(_mm256_add_ps(acc0[r], acc1[r]));
}

// A row of blocks of kBytes in the int8 GEMM's form (Int8Block32), the
// values the portable unpackers write (tested equal): codes(block) the 32
// codes as bytes, scale(block) d and min(block) m. One vector store a
// block, where the portable loops go code by code (slow for the 5-bit and
// table-lookup types, whose unpacking then cost more than the GEMM saved).
template <int kBytes, typename Codes, typename Scale, typename Min>
inline void unpack_blocks(const uint8_t* src, void* dst, int64_t n, Codes codes, Scale scale,
                          Min min) {
  Int8Block32* out = static_cast<Int8Block32*>(dst);
  for (int64_t i = 0; i < n / kBlock32; ++i, src += kBytes) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[i].codes), codes(src));
    out[i].d = scale(src);
    out[i].m = min(src);
  }
}

// No minimum (the types dotted with q8_0 blocks).
struct NoMin {
  float operator()(const uint8_t*) const { return 0.0f; }
};

// A row's dot product with q8_1 blocks for the types w = d * q + m with
// unsigned codes q (Q4_1, Q5_1: below 32): per block d * d_x * (q . q8)
// plus m * s_x, the minimum times the q8_1 block's sum. codes(block) gives
// q, the fp16 d and m are at the block's start.
template <int kBytes, typename Codes>
inline float dot_unsigned_blocks_q8_1(int64_t n, const uint8_t* w, const BlockQ8_1* x,
                                      Codes codes) {
  const int64_t blocks = n / kBlock32;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float minima = 0.0f;
  int64_t i = 0;
  for (; i + 1 < blocks; i += 2, w += 2 * kBytes) {
    const __m256i dot0 =
        dot_u8s8_add(_mm256_setzero_si256(), codes(w),
                     _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs)));
    const __m256i dot1 =
        dot_u8s8_add(_mm256_setzero_si256(), codes(w + kBytes),
                     _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i + 1].qs)));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16_scale(w) * x[i].d), _mm256_cvtepi32_ps(dot0), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(fp16_scale(w + kBytes) * x[i + 1].d),
                           _mm256_cvtepi32_ps(dot1), acc1);
    minima += fp16_scale(w + 2) * x[i].s + fp16_scale(w + kBytes + 2) * x[i + 1].s;
  }
  if (i < blocks) {
    const __m256i dot = dot_u8s8_add(_mm256_setzero_si256(), codes(w),
                                     _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs)));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16_scale(w) * x[i].d), _mm256_cvtepi32_ps(dot), acc0);
    minima += fp16_scale(w + 2) * x[i].s;
  }
  return hsum_ps(_mm256_add_ps(acc0, acc1)) + minima;
}

// A row of blocks w = d * q + m (Q4_1, Q5_1) to float32: codes(block)
// gives q as bytes, the fp16 d and m are at the block's start.
template <int kBytes, typename Codes>
inline void dequantize_blocks_with_min(const uint8_t* src, float* y, int64_t n, Codes codes) {
  for (int64_t i = 0; i < n / kBlock32; ++i, src += kBytes, y += kBlock32)
    store_scaled_codes<true>(codes(src), _mm256_set1_ps(fp16_scale(src)),
                             _mm256_set1_ps(fp16_scale(src + 2)), y);
}

}  // namespace block32
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
