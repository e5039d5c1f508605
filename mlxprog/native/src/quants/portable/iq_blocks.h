// The IQ and TQ types' block layouts (bytes per 256-weight block) and the
// decoders of their packed fields, shared by every ISA's kernels of the
// group (plain C++; each table compiles them into its own namespace).
#pragma once

#include "iq_common.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

constexpr int kIq2xxsBytes = 66;
constexpr int kIq2xsBytes = 74;
constexpr int kIq2sBytes = 82;
constexpr int kIq3xxsBytes = 98;
constexpr int kIq3sBytes = 110;
constexpr int kIq1sBytes = 50;
constexpr int kIq1mBytes = 56;
// TQ1_0: 48 + 4 bytes of packed base-3 digits, then an fp16 d.
constexpr int kTq1Bytes = 54;
constexpr int kTq1DOffset = 52;
// TQ2_0: 64 bytes of 2-bit codes, then an fp16 d.
constexpr int kTq2Bytes = 66;
constexpr int kTq2DOffset = 64;

// IQ2_S: the iq2s_grid row of the block's k-th group of 8 weights.
inline uint32_t iq2_s_index(const uint8_t* block, int k) {
  const uint32_t high = (block[66 + k / 4] >> (2 * (k % 4))) & 3;
  return block[2 + k] | (high << 8);
}

// IQ3_S: the iq3s_grid row of the block's k-th group of 4 weights.
inline uint32_t iq3_s_index(const uint8_t* block, int k) {
  const uint32_t high = (block[66 + k / 8] >> (k % 8)) & 1;
  return block[2 + k] | (high << 8);
}

// The h-th of the 4-bit scales packed two a byte (low nibble first) at
// `scales`, as the odd factor 2s + 1 (IQ2_XS's and IQ2_S's per 16 weights,
// IQ3_S's per 32).
inline int32_t nibble_scale(const uint8_t* scales, int h) {
  return 2 * ((scales[h / 2] >> (4 * (h % 2))) & 15) + 1;
}

// IQ2_XXS, IQ3_XXS: the scale of 32 weights, the top 4 bits of the uint32
// that holds their sign indices, as the odd factor 2s + 1.
inline int32_t xxs_scale(uint32_t meta) { return static_cast<int32_t>(2 * (meta >> 28) + 1); }

// IQ3_S: the scale of the block's ib-th 32 weights, as the odd factor 2s + 1.
inline int32_t iq3_s_scale(const uint8_t* block, int ib) { return nibble_scale(block + 106, ib); }

// IQ1_S: the iq1s_grid row of group l (8 weights) of the 32 weights whose
// low index bytes are `low` and whose uint16 is `high`.
inline uint32_t iq1_s_index(const uint8_t* low, uint32_t high, int l) {
  return low[l] | (((high >> (3 * l)) & 7) << 8);
}

// IQ1_M: the block's fp16 d, gathered from the top nibbles of its scale words.
inline float iq1_m_d(const uint8_t* block) {
  const uint32_t s0 = load_u16(block + 48), s1 = load_u16(block + 50);
  const uint32_t s2 = load_u16(block + 52), s3 = load_u16(block + 54);
  const uint32_t bits = (s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000);
  return fp16_to_fp32(static_cast<uint16_t>(bits));
}

// IQ1_M: the scale of the block's h-th 16 weights as the odd factor 2s + 1.
inline int32_t iq1_m_scale(const uint8_t* block, int h) {
  return static_cast<int32_t>(2 * ((load_u16(block + 48 + 2 * (h / 4)) >> (3 * (h % 4))) & 7) + 1);
}

// IQ1_M: the 4-bit field of the block's k-th group of 8 weights (bit 3 the
// shift's sign, bits 0..2 the index's high bits).
inline uint32_t iq1_m_field(const uint8_t* block, int k) {
  return (block[32 + k / 2] >> (4 * (k % 2))) & 15;
}

// IQ1_M: the iq1s_grid row of the block's k-th group of 8 weights.
inline uint32_t iq1_m_index(const uint8_t* block, int k) {
  return block[k] | ((iq1_m_field(block, k) & 7) << 8);
}

// The rows of the ternary types (TQ1_0, TQ2_0: kBytes a block, its fp16 d
// at kDOffset, weights d * (q - 1)), written once for every ISA's kernels:
// each ISA gives a block's integer sum q . x (block_dot) or its codes
// (write_codes), and its fp16 conversion (to_float).

// A ternary row . q8_K row: per block sum (q - 1) * x = sum q * x - sum x
// in integers, one float product per block.
template <int kBytes, int kDOffset, class BlockDot, class ToFloat>
inline float dot_ternary_row(int64_t n, const uint8_t* w, const void* xv, BlockDot block_dot,
                             ToFloat to_float) {
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, w += kBytes)
    sum += to_float(w + kDOffset) * x[i].d *
           static_cast<float>(block_dot(w, x[i].qs) - q8k_code_sum(x[i]));
  return sum;
}

// A ternary row in the int8 GEMM's form: write_codes(block, codes) stores
// the 256 codes q - 1; every group's scale 1, d.
template <int kBytes, int kDOffset, class WriteCodes, class ToFloat>
inline void unpack_ternary_row(const uint8_t* src, void* dst, int64_t n, WriteCodes write_codes,
                               ToFloat to_float) {
  static constexpr int kOnes[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  Int8BlockK* out = static_cast<Int8BlockK*>(dst);
  for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kBytes) {
    write_codes(src, out[i].codes);
    set_iq_int8_groups(kOnes, 8, to_float(src + kDOffset), out[i]);
  }
}

// A grid type's vector kernels (an ISA's): Group(grid, block, ib) decodes
// a block's 32 weights ib into the ISA's Group32T (its codes in the ISA's
// form and the odd scales low_scale and high_scale of its two 16s; grid:
// codebook Book), D(block) is the block's d, and the integer sums are
// taken times d / Divisor (the scales' factor: 1/8, 1/4, 1). The ISA's
// Ops: block_dot(group, q8) a block's integer sum of its eight groups
// (group(ib) each) with the q8 codes, each 16 weighted by its scale;
// store_codes(g, out) g's 32 signed codes written at out. The row
// dequantizer is the portable one.
template <Codebook Book, int BlockBytes, class Group32T,
          Group32T (*Group)(const uint8_t*, const uint8_t*, int), float (*D)(const uint8_t*),
          int Divisor, class Ops>
struct GridVectorKernels {
  // A row . a q8_K row: per block its integer sum times d(block) * x.d.
  static float vec_dot(int64_t n, const uint8_t* w, const void* xv) {
    const uint8_t* grid = grid_bytes(Book);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / kSuperBlock; ++i, w += BlockBytes) {
      auto group = [grid, w](int ib) { return Group(grid, w, ib); };
      sum += D(w) * x[i].d * static_cast<float>(Ops::block_dot(group, x[i].qs));
    }
    return (1.0f / Divisor) * sum;
  }
  // A row in the int8 GEMM's form, the portable unpacker's bytes: the
  // signed codes, the 16s' scales, d(block) / Divisor.
  static void unpack_row(const uint8_t* src, void* dst, int64_t n) {
    const uint8_t* grid = grid_bytes(Book);
    Int8BlockK* out = static_cast<Int8BlockK*>(dst);
    for (int64_t i = 0; i < n / kSuperBlock; ++i, src += BlockBytes) {
      int scales[16];
      for (int ib = 0; ib < 8; ++ib) {
        const Group32T g = Group(grid, src, ib);
        Ops::store_codes(g, out[i].codes + 32 * ib);
        scales[2 * ib] = g.low_scale;
        scales[2 * ib + 1] = g.high_scale;
      }
      set_iq_int8_groups(scales, 16, (1.0f / Divisor) * D(src), out[i]);
    }
  }
};

// A ternary type's vector kernels (an ISA's), from Vectors::visit(block,
// each), which calls each(k, codes) for each vector of a block's codes
// (0 to 2; TQ2_0's 2-bit field may hold 3 in a damaged file, read as the
// portable kernels read it) holding those of weights k on, and the ISA's
// Ops: zero() an integer accumulator, dot(acc, codes, q8) acc plus codes .
// the q8 codes at q8, total(acc) its sum, store_minus_one(codes, out) codes
// - 1 written at out, fp16(p) the fp16 at p as float. The row dequantizer is
// the portable one.
template <int kBytes, int kDOffset, class Vectors, class Ops>
struct TernaryVectorKernels {
  // A row . a q8_K row (dot_ternary_row).
  static float vec_dot(int64_t n, const uint8_t* w, const void* x) {
    return dot_ternary_row<kBytes, kDOffset>(
        n, w, x,
        [](const uint8_t* block, const int8_t* q8) {
          auto dot = Ops::zero();
          Vectors::visit(block, [&](int k, auto codes) { dot = Ops::dot(dot, codes, q8 + k); });
          return Ops::total(dot);
        },
        Ops::fp16);
  }
  // A row in the int8 GEMM's form (unpack_ternary_row): the portable
  // unpacker's bytes.
  static void unpack_row(const uint8_t* src, void* dst, int64_t n) {
    unpack_ternary_row<kBytes, kDOffset>(
        src, dst, n,
        [](const uint8_t* block, int8_t* codes) {
          Vectors::visit(block, [&](int k, auto q) { Ops::store_minus_one(q, codes + k); });
        },
        Ops::fp16);
  }
};

// A ternary type's portable kernels from Weights::visit(block, visit),
// which calls visit(k, q) for each of a block's 256 weights k and its code
// q (0 to 2).
template <int kBytes, int kDOffset, class Weights>
struct TernaryKernels {
  // A row to float32, as gguf computes it.
  static void dequantize_row(const uint8_t* src, float* y, int64_t n) {
    for (int64_t i = 0; i < n / kSuperBlock; ++i, src += kBytes, y += kSuperBlock) {
      const float d = load_fp16(src + kDOffset);
      Weights::visit(src, [&](int k, int32_t q) { y[k] = d * static_cast<float>(q - 1); });
    }
  }
  // A row . a q8_K row (dot_ternary_row).
  static float vec_dot(int64_t n, const uint8_t* w, const void* x) {
    return dot_ternary_row<kBytes, kDOffset>(
        n, w, x,
        [](const uint8_t* block, const int8_t* q8) {
          int32_t dot = 0;
          Weights::visit(block, [&](int k, int32_t q) { dot += q * q8[k]; });
          return dot;
        },
        load_fp16);
  }
  // A row in the int8 GEMM's form (unpack_ternary_row).
  static void unpack_row(const uint8_t* src, void* dst, int64_t n) {
    unpack_ternary_row<kBytes, kDOffset>(
        src, dst, n,
        [](const uint8_t* block, int8_t* codes) {
          Weights::visit(block, [&](int k, int32_t q) { codes[k] = static_cast<int8_t>(q - 1); });
        },
        load_fp16);
  }
};

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
