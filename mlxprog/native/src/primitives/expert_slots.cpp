// ExpertSlots: a counting sort of the slots by expert.
#include "primitives/expert_slots.h"

#include <algorithm>
#include <stdexcept>
#include <type_traits>

namespace mlxprog {
namespace {

// The experts `indices` (any integer dtype) pick, as int64 in [0, E).
std::vector<int64_t> read_experts(const mx::array& indices, int64_t E) {
  std::vector<uint8_t> keep;
  const void* data = contiguous_data(indices, keep);
  const int64_t n = indices.size();
  std::vector<int64_t> experts(n);
  auto read = [&](auto typed) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(typed)>>;
    const T* src = static_cast<const T*>(data);
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_unsigned_v<T>) {
        experts[i] = static_cast<int64_t>(std::min<uint64_t>(src[i], E - 1));
      } else {
        const int64_t e = src[i] < 0 ? src[i] + E : src[i];
        experts[i] = std::min<int64_t>(E - 1, std::max<int64_t>(0, e));
      }
    }
  };
  switch (indices.dtype()) {
    case mx::int8: read(static_cast<const int8_t*>(nullptr)); break;
    case mx::int16: read(static_cast<const int16_t*>(nullptr)); break;
    case mx::int32: read(static_cast<const int32_t*>(nullptr)); break;
    case mx::int64: read(static_cast<const int64_t*>(nullptr)); break;
    case mx::uint8: read(static_cast<const uint8_t*>(nullptr)); break;
    case mx::uint16: read(static_cast<const uint16_t*>(nullptr)); break;
    case mx::uint32: read(static_cast<const uint32_t*>(nullptr)); break;
    case mx::uint64: read(static_cast<const uint64_t*>(nullptr)); break;
    default: throw std::invalid_argument("mlxprog native: expert indices must be integers");
  }
  return experts;
}

}  // namespace

ExpertSlots::ExpertSlots(const mx::array& indices, int64_t E)
    : k_(indices.ndim() ? indices.shape(-1) : 1), first_(E + 1, 0) {
  const std::vector<int64_t> experts = read_experts(indices, E);
  const int64_t n = static_cast<int64_t>(experts.size());
  for (int64_t s = 0; s < n; ++s) ++first_[experts[s] + 1];
  for (int64_t e = 0; e < E; ++e) first_[e + 1] += first_[e];
  order_.resize(n);
  std::vector<int64_t> next(first_.begin(), first_.end() - 1);
  for (int64_t s = 0; s < n; ++s) order_[next[experts[s]]++] = s;
  for (int64_t e = 0; e < E; ++e)
    if (count(e)) chosen_.push_back(e);
}

}  // namespace mlxprog
