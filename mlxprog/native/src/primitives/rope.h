// RoPE's inverse frequencies, which an attention block computes too:
// rope_inv_freqs.
#pragma once

#include <optional>
#include <vector>

#include "primitive.h"

namespace mlxprog {

// The RoPE kernel's dims / 2 inverse frequencies, already times `scale`:
// scale / freqs[i] where `freqs` is given, else scale * base ** (-2i / dims).
std::vector<float> rope_inv_freqs(int dims, float base, float scale,
                                  const std::optional<mx::array>& freqs,
                                  std::vector<uint8_t>& keep);

}  // namespace mlxprog
