// x86: the int8 GEMM over unpacked weight rows (Int8BlockK, Int8Block32)
// and rows of activation blocks, in AVX2. Unsigned codes go straight into
// the byte multiply-add, signed ones as |w| times x with w's sign. Two
// 256-element rows meet four rows of x at a time, each chunk of codes loaded
// once for the four and each chunk of x once for the two; per block the
// group scales weight the int16 pair sums into int32 lanes (one
// multiply-add), so the float work is two multiply-adds per block. The
// 32-element types interleave eight weight rows (Panel32) so that one float
// multiply-add per block serves eight products.
#pragma once

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace int8_gemm_x86 {

// Rows of x a weight row meets together.
constexpr int kRows = 4;

// The sum of v's eight lanes.
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The products of 32 codes with 32 q8 codes as int16 pair sums: codes
// (unsigned, or their magnitudes `mag` with signed codes) times q8 (with
// the codes' signs moved onto it).
template <bool Signed>
[[gnu::always_inline]] inline __m256i pair_products(__m256i codes, __m256i mag, const int8_t* q8) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8));
  return Signed ? _mm256_maddubs_epi16(mag, _mm256_sign_epi8(q, codes))
                : _mm256_maddubs_epi16(codes, q);
}

// W unpacked 256-element weight rows w[v] against R q8_K rows x[r]:
// out[r * ldo + v]. Each chunk of 32 codes of a weight row is loaded once
// for the R rows of x, and each chunk of x once for the W weight rows; each
// product keeps its own accumulators and order, so it is the same float
// whatever W and R are.
template <int W, int R, bool Signed>
struct RowsK {
  static void run(const Int8BlockK* const* w, int64_t blocks, const BlockQ8_K* const* x,
                  float* out, int64_t ldo) {
    // Byte shuffle that spreads int16 scale 0 of a 32-bit lane over the low
    // 128 bits and scale 1 over the high ones: chunk c's two groups.
    const __m256i spread = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,  //
                                            2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    __m256 acc[W][R];
    for (int v = 0; v < W; ++v)
      for (int r = 0; r < R; ++r) acc[v][r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      __m256i dots[W][R];
      for (int v = 0; v < W; ++v)
        for (int r = 0; r < R; ++r) dots[v][r] = _mm256_setzero_si256();
      // Unrolled by two, not eight: fully unrolled, the scales of every
      // chunk are computed up front and spilled (AVX2 has 16 registers).
#pragma GCC unroll 2
      for (int c = 0; c < 8; ++c) {
        __m256i codes[W], mag[W], group_scales[W];
        for (int v = 0; v < W; ++v) {
          codes[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[v][b].codes + 32 * c));
          mag[v] = Signed ? _mm256_abs_epi8(codes[v]) : codes[v];
          int32_t scale_pair;  // the int16 scales of groups 2c and 2c + 1
          std::memcpy(&scale_pair, w[v][b].scales + 2 * c, 4);
          group_scales[v] = _mm256_shuffle_epi8(_mm256_set1_epi32(scale_pair), spread);
        }
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < W; ++v)
            dots[v][r] = _mm256_add_epi32(
                dots[v][r],
                _mm256_madd_epi16(pair_products<Signed>(codes[v], mag[v], x[r][b].qs + 32 * c),
                                  group_scales[v]));
      }
      for (int r = 0; r < R; ++r) {
        const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r][b].bsums));
        const __m256 dx = _mm256_set1_ps(x[r][b].d);
        for (int v = 0; v < W; ++v) {
          const Int8BlockK& wb = w[v][b];
          const __m256i min_dots = _mm256_madd_epi16(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb.mins)), bsums);
          acc[v][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[v][r]),
                                      _mm256_mul_ps(dx, _mm256_set1_ps(wb.d)), acc[v][r]);
          acc[v][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(min_dots),
                                      _mm256_mul_ps(dx, _mm256_set1_ps(wb.dm)), acc[v][r]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < W; ++v) out[r * ldo + v] = hsum(acc[v][r]);
  }
};

// rows_w unpacked 256-element weight rows against R q8_K rows x[r]:
// y[r * ldy + j], two weight rows at a time.
template <int R, bool Signed>
void weight_rows_k(const Int8BlockK* w, int64_t blocks, int64_t rows_w,
                   const BlockQ8_K* const* x, float* y, int64_t ldy) {
  int64_t j = 0;
  for (; j + 2 <= rows_w; j += 2) {
    const Int8BlockK* pair[2] = {w + j * blocks, w + (j + 1) * blocks};
    RowsK<2, R, Signed>::run(pair, blocks, x, y + j, ldy);
  }
  if (j < rows_w) {
    const Int8BlockK* last[1] = {w + j * blocks};
    RowsK<1, R, Signed>::run(last, blocks, x, y + j, ldy);
  }
}

// The 32-element types' GEMM works on eight weight rows at once, their
// codes interleaved four bytes at a time: vector k of block b holds bytes
// 4k..4k+3 of each of the eight rows, so one broadcast of four bytes of x
// multiplies all eight rows, the int32 lanes are the eight rows' dots, and
// the float work (the block scales) is one multiply-add per block for
// eight products. Panel32 is that form of eight rows' blocks.
struct Panel32 {
  std::vector<__m256i> codes;  // [block][k]: rows' bytes 4k..4k+3
  std::vector<__m256i> mag;    // the same, magnitudes (signed codes)
  std::vector<__m256> d, m;    // [block]: each row's d and m
};

// The 8 x 8 int32 transpose of v: lane r of out[k] is lane k of v[r].
[[gnu::always_inline]] inline void transpose_8x8(const __m256i v[8], __m256i out[8]) {
  __m256i pairs[8], quads[8];
  for (int r = 0; r < 8; r += 2) {
    pairs[r] = _mm256_unpacklo_epi32(v[r], v[r + 1]);      // r0 r1 r0 r1 (k 0, 1 | 4, 5)
    pairs[r + 1] = _mm256_unpackhi_epi32(v[r], v[r + 1]);  // (k 2, 3 | 6, 7)
  }
  for (int h = 0; h < 2; ++h)
    for (int q = 0; q < 2; ++q) {
      quads[4 * q + 2 * h] = _mm256_unpacklo_epi64(pairs[4 * q + h], pairs[4 * q + 2 + h]);
      quads[4 * q + 2 * h + 1] = _mm256_unpackhi_epi64(pairs[4 * q + h], pairs[4 * q + 2 + h]);
    }
  // quads[4q + j] holds rows 4q..4q+3 of k = j (low half) and k = j + 4 (high half).
  for (int j = 0; j < 4; ++j) {
    out[j] = _mm256_permute2x128_si256(quads[j], quads[4 + j], 0x20);
    out[j + 4] = _mm256_permute2x128_si256(quads[j], quads[4 + j], 0x31);
  }
}

// Rows [j0, j0 + rows) (rows <= 8) of unpacked weight rows w into `panel`
// (missing rows are zero): each block's eight rows of codes transposed as
// 8 x 8 groups of four bytes. The panel's vectors are sized once and
// overwritten whole.
inline void interleave(const Int8Block32* w, int64_t blocks, int64_t j0, int64_t rows,
                       bool signed_codes, Panel32& panel) {
  panel.codes.resize(blocks * 8);
  panel.mag.resize(signed_codes ? blocks * 8 : 0);
  panel.d.resize(blocks);
  panel.m.resize(blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i row_codes[8];
    alignas(32) float d[8] = {}, m[8] = {};
    for (int64_t j = 0; j < 8; ++j) {
      if (j < rows) {
        const Int8Block32& wb = w[(j0 + j) * blocks + b];
        row_codes[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb.codes));
        d[j] = wb.d;
        m[j] = wb.m;
      } else {
        row_codes[j] = _mm256_setzero_si256();
      }
    }
    __m256i* codes = &panel.codes[b * 8];
    transpose_8x8(row_codes, codes);
    if (signed_codes)
      for (int k = 0; k < 8; ++k) panel.mag[b * 8 + k] = _mm256_abs_epi8(codes[k]);
    panel.d[b] = _mm256_load_ps(d);
    panel.m[b] = _mm256_load_ps(m);
  }
}

// A panel's eight rows against R rows of Act (q8_0 or q8_1; with q8_1 the
// m term takes each block's s): out[r] holds the eight products of x row r.
template <int R, bool Signed, class Act>
[[gnu::always_inline]] inline void panel_rows(const Panel32& panel, int64_t blocks,
                                              const Act* const* x, __m256* out) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r) out[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i dots[R];
    for (int r = 0; r < R; ++r) dots[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m256i codes = panel.codes[b * 8 + k];
      const __m256i mag = Signed ? panel.mag[b * 8 + k] : codes;
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, x[r][b].qs + 4 * k, 4);
        __m256i q = _mm256_set1_epi32(four);
        if (Signed) q = _mm256_sign_epi8(q, codes);
        dots[r] =
            _mm256_add_epi32(dots[r], _mm256_madd_epi16(_mm256_maddubs_epi16(mag, q), ones));
      }
    }
    for (int r = 0; r < R; ++r) {
      out[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[r]),
                               _mm256_mul_ps(panel.d[b], _mm256_set1_ps(x[r][b].d)), out[r]);
      if constexpr (std::is_same_v<Act, BlockQ8_1>)
        out[r] = _mm256_fmadd_ps(panel.m[b], _mm256_set1_ps(x[r][b].s), out[r]);
    }
  }
}

// The GEMM of unpacked 32-element rows with rows of Act: eight weight rows
// (one panel) against four rows of x at a time.
template <class Act>
void gemm_32(int64_t K, const void* wv, int64_t rows_w, bool signed_codes, const uint8_t* x,
             size_t act_row, int64_t rows_x, float* y, int64_t ldy) {
  const int64_t blocks = K / 32;
  const Int8Block32* w = static_cast<const Int8Block32*>(wv);
  Panel32 panel;
  for (int64_t j0 = 0; j0 < rows_w; j0 += 8) {
    const int64_t rows = std::min<int64_t>(8, rows_w - j0);
    interleave(w, blocks, j0, rows, signed_codes, panel);
    for (int64_t i = 0; i < rows_x; i += kRows) {
      const int64_t count = std::min<int64_t>(kRows, rows_x - i);
      const Act* xs[kRows];
      for (int64_t r = 0; r < count; ++r)
        xs[r] = reinterpret_cast<const Act*>(x + (i + r) * act_row);
      __m256 out[kRows];
      if (count == kRows)
        signed_codes ? panel_rows<kRows, true>(panel, blocks, xs, out)
                     : panel_rows<kRows, false>(panel, blocks, xs, out);
      else
        for (int64_t r = 0; r < count; ++r)
          signed_codes ? panel_rows<1, true>(panel, blocks, xs + r, out + r)
                       : panel_rows<1, false>(panel, blocks, xs + r, out + r);
      for (int64_t r = 0; r < count; ++r) {
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, out[r]);
        std::memcpy(y + (i + r) * ldy + j0, lanes, rows * sizeof(float));
      }
    }
  }
}

// The GEMM of unpacked 256-element rows with q8_K rows: two weight rows
// against four rows of x at a time (the rest of x one row at a time).
void gemm_k(int64_t K, const void* wv, int64_t rows_w, bool signed_codes, const uint8_t* x,
            size_t act_row, int64_t rows_x, float* y, int64_t ldy) {
  const int64_t blocks = K / 256;
  const Int8BlockK* w = static_cast<const Int8BlockK*>(wv);
  for (int64_t i = 0; i < rows_x; i += kRows) {
    const int64_t count = std::min<int64_t>(kRows, rows_x - i);
    const BlockQ8_K* xs[kRows];
    for (int64_t r = 0; r < count; ++r)
      xs[r] = reinterpret_cast<const BlockQ8_K*>(x + (i + r) * act_row);
    if (count == kRows)
      signed_codes ? weight_rows_k<kRows, true>(w, blocks, rows_w, xs, y + i * ldy, ldy)
                   : weight_rows_k<kRows, false>(w, blocks, rows_w, xs, y + i * ldy, ldy);
    else
      for (int64_t r = 0; r < count; ++r)
        signed_codes ? weight_rows_k<1, true>(w, blocks, rows_w, xs + r, y + (i + r) * ldy, ldy)
                     : weight_rows_k<1, false>(w, blocks, rows_w, xs + r, y + (i + r) * ldy, ldy);
  }
}

}  // namespace int8_gemm_x86
}  // namespace

// Registers the int8 GEMM of each activation kind.
inline void add_int8_gemm(QuantKernels& k) {
  using namespace int8_gemm_x86;
  k.int8_gemm[static_cast<int>(Activation::q8_K)] = gemm_k;
  k.int8_gemm[static_cast<int>(Activation::q8_0)] = gemm_32<BlockQ8_0>;
  k.int8_gemm[static_cast<int>(Activation::q8_1)] = gemm_32<BlockQ8_1>;
}

}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
