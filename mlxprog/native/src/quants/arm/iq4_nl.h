// arm IQ4_NL (see portable/iq4_nl.h): the 4-bit indices looked up in the
// value table with one table lookup per 16.
#pragma once

#include "block32.h"

namespace mlxprog {
namespace quants {
namespace MLXPROG_QUANTS_NS {
namespace {
namespace block32 {

// An IQ4_NL block's 32 table values.
inline Codes32 iq4_nl_codes(const uint8_t* block) {
  return lookup_16(kIq4Levels, nibbles_32(block + 2));
}

// A row of IQ4_NL blocks to float32, as gguf computes it.
void dequantize_row_iq4_nl(const uint8_t* src, float* y, int64_t n) {
  dequantize_blocks<kIq4nlBytes>(src, y, n, iq4_nl_codes, fp16_scale);
}

// IQ4_NL row . q8_0 row.
float vec_dot_iq4_nl(int64_t n, const uint8_t* w, const void* x) {
  return dot_blocks_q8_0<kIq4nlBytes>(n, w, static_cast<const BlockQ8_0*>(x), iq4_nl_codes,
                                      fp16_scale);
}

}  // namespace block32
}  // namespace
}  // namespace MLXPROG_QUANTS_NS
}  // namespace quants
}  // namespace mlxprog
