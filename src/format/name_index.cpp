#include "format/name_index.hpp"

#include <bit>
#include <functional>

#include "ferry/error.hpp"

namespace ferry::detail {
namespace {

std::uint64_t hash_of(std::string_view name) { return std::hash<std::string_view>{}(name); }

}  // namespace

std::optional<std::pair<std::size_t, std::size_t>> NameIndex::build(
    const std::vector<TensorInfo>& tensors) {
  // Positions are stored in 32 bits; a header within the format's size limit holds far fewer.
  FERRY_EXPECT(tensors.size() < UINT32_MAX, std::length_error, tensors.size(),
               " tensors are too many to index");
  const std::size_t capacity = std::bit_ceil(std::max<std::size_t>(16, tensors.size() * 2));
  _slots.assign(capacity, 0);
  _mask = capacity - 1;
  std::optional<std::pair<std::size_t, std::size_t>> repeated;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t hash = hash_of(tensors[i].name);
    const std::uint64_t tag = hash >> 32 << 32;
    for (std::size_t at = hash & _mask;; at = (at + 1) & _mask) {
      const std::uint64_t slot = _slots[at];
      if (slot == 0) {
        _slots[at] = tag | (i + 1);
        break;
      }
      const std::size_t other = (slot & 0xffffffffu) - 1;
      if ((slot >> 32 << 32) == tag && tensors[other].name == tensors[i].name) {
        if (!repeated) repeated.emplace(other, i);
        break;
      }
    }
  }
  return repeated;
}

std::size_t NameIndex::find(std::string_view name, const std::vector<TensorInfo>& tensors) const {
  if (_slots.empty()) return npos;
  const std::uint64_t hash = hash_of(name);
  const std::uint64_t tag = hash >> 32 << 32;
  for (std::size_t at = hash & _mask;; at = (at + 1) & _mask) {
    const std::uint64_t slot = _slots[at];
    if (slot == 0) return npos;
    const std::size_t position = (slot & 0xffffffffu) - 1;
    if ((slot >> 32 << 32) == tag && tensors[position].name == name) return position;
  }
}

}  // namespace ferry::detail
