// x86-64 vector helpers the quant types share (AVX2; the dot products of
// unsigned by signed bytes use VNNI where the table is compiled with it).
namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {

// The sum of a vector's eight floats.
inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The sum of a vector's eight int32.
inline int hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}

// acc + the sums of each four adjacent products u[i] * s[i] (u unsigned,
// s signed bytes) as eight int32: one vpdpbusd with VNNI; with AVX2,
// vpmaddubsw (whose int16 pair sums saturate only when both products are
// near +-32640: the callers keep u below 128 or s above -128) and vpmaddwd.
inline __m256i dot_u8s8_add(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  const __m256i pairs = _mm256_maddubs_epi16(u, s);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
}

// The sums of each four adjacent products a[i] * b[i] of signed bytes as
// eight int32 (|a| times b with a's signs moved onto b; a == -128 never
// occurs in the callers' codes).
inline __m256i dot_s8s8(__m256i a, __m256i b) {
  return dot_u8s8_add(_mm256_setzero_si256(), _mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

// 32 bytes of 4-bit codes (16 bytes: low nibbles are elements 0..15, high
// nibbles 16..31, as GGML's 32-blocks store them) as 32 bytes 0..15: the 16
// bytes loaded into both halves (a load, no shuffle), the high half shifted
// right by 4 bits.
inline __m256i nibbles_32(const uint8_t* p) {
  const __m256i both =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i shifted = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
  return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
}

}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
