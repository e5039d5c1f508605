// x86 TQ1_0 (AVX2): its digit vectors, from which iq_x86::TernaryKernels
// makes the dot product with q8_K activations and the int8 unpacker
// (portable/tq1_0.h has the layout; its row dequantizer is the portable
// one). Digit j of a packed byte is the top base-3 digit of byte * 3^j
// (mod 256); 32 bytes' digits come at once from 16-bit multiplies, the low
// and high byte of each lane apart so that no product carries into its
// neighbour. The block's integer sums and unpacked codes are the
// portable kernels'.
#pragma once

#include "iq_simd.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace tq1_x86 {

// The top base-3 digit (0, 1 or 2) of each byte of `bytes` times the byte
// of `pow3` in the same place, mod 256: (t * 3) >> 8 of t = b * p mod 256,
// as the high half of t * 768 (low bytes) or of (t << 8) * 3 (high bytes).
[[gnu::always_inline]] inline __m256i top_digits(__m256i bytes, __m256i pow3) {
  const __m256i low = _mm256_set1_epi16(0x00FF);
  const __m256i low_t = _mm256_and_si256(
      _mm256_mullo_epi16(_mm256_and_si256(bytes, low), _mm256_and_si256(pow3, low)), low);
  // (b << 8) * p = (b * p mod 256) << 8 (mod 2^16): the high byte's t.
  const __m256i high_t =
      _mm256_mullo_epi16(_mm256_andnot_si256(low, bytes), _mm256_srli_epi16(pow3, 8));
  return _mm256_or_si256(
      _mm256_mulhi_epu16(low_t, _mm256_set1_epi16(768)),
      _mm256_slli_epi16(_mm256_mulhi_epu16(high_t, _mm256_set1_epi16(3)), 8));
}

// 3^j mod 256 in every byte.
inline __m256i power_of_3(int j) {
  static constexpr uint8_t kPowers[5] = {1, 3, 9, 27, 81};
  return _mm256_set1_epi8(static_cast<char>(kPowers[j]));
}

// TQ1_0's digit vectors: each(k, digits) for the eight vectors of a
// block's digits (0 to 2), digits holding those of weights k to k + 31: the
// 32-byte span's five digits; the 16-byte span's digits two at a time (one
// in each half), its last with the 4-byte span's four (digit j in 32-bit
// group j of the high half).
struct Vectors {
  template <class Each>
  [[gnu::always_inline]] static void visit(const uint8_t* block, Each each) {
    const __m256i last_powers = _mm256_setr_epi8(
        81, 81, 81, 81, 81, 81, 81, 81, 81, 81, 81, 81, 81, 81, 81, 81,  //
        1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27);
    const __m256i span32 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block));
    for (int j = 0; j < 5; ++j) each(32 * j, top_digits(span32, power_of_3(j)));
    const __m128i span16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 32));
    const __m256i span16_twice = _mm256_broadcastsi128_si256(span16);
    for (int j = 0; j < 4; j += 2)
      each(160 + 16 * j,
           top_digits(span16_twice, _mm256_set_m128i(_mm256_castsi256_si128(power_of_3(j + 1)),
                                                     _mm256_castsi256_si128(power_of_3(j)))));
    const __m256i last =
        _mm256_set_m128i(_mm_set1_epi32(static_cast<int>(load_u32(block + 48))), span16);
    each(224, top_digits(last, last_powers));
  }
};

}  // namespace tq1_x86

// TQ1_0's dot product and int8 unpacker.
using Tq1Kernels = iq_x86::TernaryKernels<kTq1Bytes, kTq1DOffset, tq1_x86::Vectors>;

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
