// x86 helpers the IQ grid types' kernels share (AVX2): grid rows loaded
// into vectors, sign bits spread to bytes, each type's 32 weights decoded
// into Group32, and the AVX2 operations (GridOps, TernaryOps) with which
// portable/iq_blocks.h's GridVectorKernels and TernaryVectorKernels walk
// the rows for the dot product with q8 codes and for the int8 unpacker.
// Each block's integer sum is the portable kernel's (exact), so the dot
// products equal the portable ones but for the float products'
// contraction.
#pragma once

#include "../portable/iq_blocks.h"
#include "kquant_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace iq_x86 {

// 32 bytes, byte j -1 where bit j of `bits` is set and +1 otherwise: the
// second operand of _mm256_sign_epi8 that negates those elements.
[[gnu::always_inline]] inline __m256i sign_bytes(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                       2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                         _mm256_set1_epi8(1));
}

// The 8-byte grid rows of four int32 indices (computed in lanes) as one
// vector, row of lane 0 first. Loads and inserts: AVX2's gathers measured
// 0-13% slower here on Zen 3 (IQ3_S's eight rows 3% faster).
[[gnu::always_inline]] inline __m256i rows_of_8(const uint8_t* grid, __m128i indices) {
  alignas(16) uint32_t idx[4];
  _mm_store_si128(reinterpret_cast<__m128i*>(idx), indices);
  int64_t r[4];
  for (int k = 0; k < 4; ++k) std::memcpy(&r[k], grid + 8 * idx[k], 8);
  return _mm256_set_epi64x(r[3], r[2], r[1], r[0]);
}

// The 4-byte grid rows of eight int32 indices as one vector.
[[gnu::always_inline]] inline __m256i rows_of_4(const uint8_t* grid, __m256i indices) {
  alignas(32) uint32_t idx[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(idx), indices);
  int r[8];
  for (int k = 0; k < 8; ++k) std::memcpy(&r[k], grid + 4 * idx[k], 4);
  return _mm256_setr_epi32(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
}

// Four bytes at p as four int32 lanes.
[[gnu::always_inline]] inline __m128i bytes_4(const uint8_t* p) {
  return _mm_cvtepu8_epi32(_mm_cvtsi32_si128(static_cast<int>(load_u32(p))));
}

// Eight bytes at p as eight int32 lanes.
[[gnu::always_inline]] inline __m256i bytes_8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// The fields of `bits` at bits 0, step, 2 * step and 3 * step (masked by
// `mask`) as four int32 lanes, moved up by 8: the high bits of four grid
// indices whose low 8 bits are bytes.
[[gnu::always_inline]] inline __m128i high_bits_4(uint32_t bits, int step, uint32_t mask) {
  const __m128i fields = _mm_srlv_epi32(_mm_set1_epi32(static_cast<int>(bits)),
                                        _mm_setr_epi32(0, step, 2 * step, 3 * step));
  return _mm_slli_epi32(_mm_and_si128(fields, _mm_set1_epi32(static_cast<int>(mask))), 8);
}

// The scales of 32 codes as int16 lanes: `low` for elements 0..15, `high`
// for 16..31.
[[gnu::always_inline]] inline __m256i scales_16(int low, int high) {
  return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(high)),
                          _mm_set1_epi16(static_cast<int16_t>(low)));
}

// 32 weights of a block decoded: their magnitudes (unsigned, below 128),
// their signs (sign_bytes' form: never zero) and the odd integer scales of
// their two 16s.
struct Group32 {
  __m256i magnitudes, signs;
  int low_scale, high_scale;
};

// The fp16 d at the start of a block (every grid type but IQ1_M).
[[gnu::always_inline]] inline float leading_d(const uint8_t* block) {
  return kquant::fp16_at(block);
}

// An IQ1 group's codes 8 * grid +- 1 (the rows of the ternary grid, the
// shift bytes +-1) in Group32's form: magnitudes and the codes as signs.
[[gnu::always_inline]] inline Group32 shifted_group(__m256i rows, __m256i shifts, int low_scale,
                                                    int high_scale) {
  const __m256i codes = _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), rows), shifts);
  return {_mm256_sign_epi8(codes, codes), codes, low_scale, high_scale};
}

// The AVX2 operations of the grid types' GridVectorKernels: per 32
// weights one byte multiply-add of the magnitudes with the q8 codes
// carrying the signs, one int16 multiply-add with the scales; two integer
// accumulators a block.
struct GridOps {
  template <class Group>
  [[gnu::always_inline]] static int32_t block_dot(Group group, const int8_t* q8) {
    __m256i dot[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 8
    for (int ib = 0; ib < 8; ++ib) {
      const Group32 g = group(ib);
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32 * ib));
      const __m256i pairs = _mm256_maddubs_epi16(g.magnitudes, _mm256_sign_epi8(q, g.signs));
      const __m256i scaled = _mm256_madd_epi16(pairs, scales_16(g.low_scale, g.high_scale));
      dot[ib % 2] = _mm256_add_epi32(dot[ib % 2], scaled);
    }
    return hsum_epi32(_mm256_add_epi32(dot[0], dot[1]));
  }
  [[gnu::always_inline]] static void store_codes(const Group32& g, int8_t* out) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_sign_epi8(g.magnitudes, g.signs));
  }
};

// One grid type's kernels (see GridVectorKernels).
template <Codebook Book, int BlockBytes, Group32 (*Group)(const uint8_t*, const uint8_t*, int),
          float (*D)(const uint8_t*), int Divisor>
using GridKernels = GridVectorKernels<Book, BlockBytes, Group32, Group, D, Divisor, GridOps>;

// The AVX2 operations of the ternary types' TernaryVectorKernels (32 codes
// a vector).
struct TernaryOps {
  static __m256i zero() { return _mm256_setzero_si256(); }
  [[gnu::always_inline]] static __m256i dot(__m256i acc, __m256i codes, const int8_t* q8) {
    return dot_u8s8_add(acc, codes, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8)));
  }
  static int32_t total(__m256i acc) { return hsum_epi32(acc); }
  [[gnu::always_inline]] static void store_minus_one(__m256i codes, int8_t* out) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                        _mm256_sub_epi8(codes, _mm256_set1_epi8(1)));
  }
  static float fp16(const uint8_t* p) { return kquant::fp16_at(p); }
};

// A ternary type's kernels (TQ1_0, TQ2_0) from its code vectors (32 a
// vector).
template <int kBytes, int kDOffset, class Vectors>
using TernaryKernels = TernaryVectorKernels<kBytes, kDOffset, Vectors, TernaryOps>;

}  // namespace iq_x86
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
