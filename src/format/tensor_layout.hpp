// What every format's reader checks last: names without NUL characters, tensors sorted by
// offset and not overlapping, then made absolute. Offsets arrive relative to the data section, which starts at `data_start`.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ferry/tensor_info.hpp"

namespace ferry::detail {

// Throws FormatError naming `label` and the tensor for a NUL in a name, or both tensors where
// two overlap.
void finish_tensor_layout(std::vector<TensorInfo>& tensors, std::uint64_t data_start,
                          std::string_view label);

}  // namespace ferry::detail
