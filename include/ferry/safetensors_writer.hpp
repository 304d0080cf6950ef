// Writes safetensors files the way Hugging Face's writer lays them out (header padded with
// spaces to 8 bytes, tensors packed in the order given). Used by `ferry demo` and by tests
// that need files too large to keep in memory: tensor bytes are produced one tensor at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "ferry/tensor_info.hpp"

namespace ferry {

struct TensorSpec {
  std::string name;
  DType dtype = DType::U8;
  std::vector<std::uint64_t> shape;
};

// Calls `fill` once per tensor, in order, with a buffer of exactly its size to fill; returns
// the written layout (absolute offsets). Throws std::system_error naming the path on I/O errors.
std::vector<TensorInfo> write_safetensors(
    const std::filesystem::path& path, std::span<const TensorSpec> tensors,
    const std::function<void(const TensorSpec&, std::span<std::byte>)>& fill,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace ferry
