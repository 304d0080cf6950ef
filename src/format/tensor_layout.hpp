// What every format's reader checks last: names without NUL characters, tensors sorted by
// offset and not overlapping, then made absolute. Offsets arrive relative to the data section, which starts at `data_start`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/tensor_info.hpp"

namespace ferry::detail {

// The one rule for tensor names, for reading and writing alike (a saver must not write what the
// loader refuses): no NUL character. Why `name` breaks it, or "" where it does not.
std::string tensor_name_problem(std::string_view name);

// `name` for a message: cut at a NUL, shown as \0...
std::string shown_name(std::string_view name);

// Throws FormatError naming `label` and the tensor for a NUL in a name, or both tensors where
// two overlap.
void finish_tensor_layout(std::vector<TensorInfo>& tensors, std::uint64_t data_start,
                          std::string_view label);

}  // namespace ferry::detail
