// The slots of a mixture-of-experts matmul grouped by expert, which the
// gathered matmuls (ggml_gather_matmul, gather_quantized_matmul) share: each
// expert's weights are then read once for all of its slots, and only the
// experts some slot picks are read at all.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "primitive.h"

namespace mlxprog {

class ExpertSlots {
 public:
  // The slots of `indices` ([..., k], any integer dtype) over E experts:
  // negative indices counted from the end, the rest clamped into [0, E).
  // Slot s is element s of indices (token s / k, its slot s % k).
  ExpertSlots(const mx::array& indices, int64_t E);

  // The experts at least one slot picked, ascending.
  const std::vector<int64_t>& chosen() const { return chosen_; }
  // How many slots picked expert e.
  int64_t count(int64_t e) const { return first_[e + 1] - first_[e]; }
  // Expert e's slots, ascending: count(e) of them.
  const int64_t* slots(int64_t e) const { return order_.data() + first_[e]; }
  // (row of x, row of the result) of expert e's i-th slot, x holding one row
  // per token (shared by its k slots) or, per_slot, one per slot.
  std::pair<int64_t, int64_t> rows(int64_t e, int64_t i, bool per_slot) const {
    const int64_t s = slots(e)[i];
    return {per_slot ? s : s / k_, s};
  }

 private:
  int64_t k_;
  std::vector<int64_t> first_, order_, chosen_;
};

}  // namespace mlxprog
