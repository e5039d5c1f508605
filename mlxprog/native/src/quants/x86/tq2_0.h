// x86 TQ2_0 (AVX2): the dot product with q8_K activations and the int8
// unpacker (portable/tq2_0.h has the layout; its row dequantizer is the
// portable one). Bits 2j of the 32 bytes of half g are the codes of the 32
// consecutive weights 128g + 32j: one shift and mask a vector. The block's
// integer sums and unpacked codes are the portable kernels'.
#pragma once

#include "../portable/iq_blocks.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace tq2_x86 {

// visit(k, codes) for the eight vectors of a block's codes (0 to 3), codes
// holding those of weights k to k + 31.
template <class Visit>
[[gnu::always_inline]] inline void visit_code_vectors(const uint8_t* block, Visit visit) {
  const __m256i two_bits = _mm256_set1_epi8(3);
  for (int g = 0; g < 2; ++g) {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * g));
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
      visit(128 * g + 32 * j, _mm256_and_si256(_mm256_srli_epi16(packed, 2 * j), two_bits));
  }
}

// TQ2_0 row . q8_K row: per block sum (q - 1) * x = sum q * x - sum x.
float vec_dot_tq2_0(int64_t n, const uint8_t* w, const void* xv) {
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, w += kTq2Bytes) {
    const int8_t* q8 = x[i].qs;
    __m256i dot = _mm256_setzero_si256();
    visit_code_vectors(w, [&](int k, __m256i codes) {
      dot = dot_u8s8_add(dot, codes, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + k)));
    });
    sum += _cvtsh_ss(static_cast<uint16_t>(load_u16(w + 64))) * x[i].d *
           static_cast<float>(hsum_epi32(dot) - q8k_code_sum(x[i]));
  }
  return sum;
}

// A row of TQ2_0 blocks in the int8 GEMM's form: codes q - 1, every group's
// scale 1, d.
void int8_unpack_row_tq2_0(const uint8_t* src, void* dst, int64_t n) {
  static constexpr int kOnes[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kTq2Bytes) {
    int8_t* codes = out[i].codes;
    visit_code_vectors(src, [&](int k, __m256i q) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + k),
                          _mm256_sub_epi8(q, _mm256_set1_epi8(1)));
    });
    set_iq_int8_groups(kOnes, 8, _cvtsh_ss(static_cast<uint16_t>(load_u16(src + 64))), out[i]);
  }
}

}  // namespace tq2_x86
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
