#include "format/tensor_layout.hpp"

#include <algorithm>

#include "ferry/error.hpp"

namespace ferry::detail {

std::string tensor_name_problem(std::string_view name) {
  // C strings end at a NUL: through the C ABI "a\0b" would read as "a", another tensor's name.
  if (name.find('\0') != std::string_view::npos) return "a NUL character in a name";
  return {};
}

std::string shown_name(std::string_view name) {
  const std::size_t nul = name.find('\0');
  if (nul == std::string_view::npos) return std::string(name);
  return std::string(name.substr(0, nul)) + "\\0...";
}

void finish_tensor_layout(std::vector<TensorInfo>& tensors, std::uint64_t data_start,
                          std::string_view label) {
  for (const auto& t : tensors)
    if (std::string why = tensor_name_problem(t.name); !why.empty())
      detail::fail<FormatError>(label, ": tensor \"", shown_name(t.name), "\": ", why);
  const auto by_offset = [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.size < b.size;
  };
  // Writers usually list tensors in data order: one pass instead of a sort then.
  if (!std::is_sorted(tensors.begin(), tensors.end(), by_offset))
    std::sort(tensors.begin(), tensors.end(), by_offset);
  for (std::size_t i = 1; i < tensors.size(); ++i) {
    const auto& prev = tensors[i - 1];
    const auto& cur = tensors[i];
    FERRY_FORMAT_EXPECT(cur.offset >= prev.offset + prev.size, label, ": tensors \"", prev.name,
                        "\" [", prev.offset, ", ", prev.offset + prev.size, ") and \"", cur.name,
                        "\" [", cur.offset, ", ", cur.offset + cur.size, ") overlap");
  }
  for (auto& t : tensors) t.offset += data_start;
}

}  // namespace ferry::detail
