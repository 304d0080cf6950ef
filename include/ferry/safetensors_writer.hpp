// Writes safetensors files byte for byte as Hugging Face's writer lays them out:
//
//   [u64 little-endian N][N bytes of JSON, padded with spaces to a multiple of 8][tensor data]
//
// The JSON holds "__metadata__" first (when given, even empty), then one entry per tensor,
// {"dtype":"F32","shape":[2,3],"data_offsets":[begin,end]}, in data order. safetensors orders
// tensors by descending dtype rank (its Dtype enum: U64, I64, F64, C64, F32, ... BOOL) and then
// by name (bytewise), packing them without gaps; safetensors_write_order() gives that order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ferry/tensor_info.hpp"

namespace ferry {

struct TensorSpec {
  std::string name;
  DType dtype = DType::U8;
  std::vector<std::uint64_t> shape;
};

// Free-form string pairs of "__metadata__", written in this order. (safetensors keeps them in a
// hash map, so its order of two or more keys changes from process to process.)
using SafetensorsMetadata = std::vector<std::pair<std::string, std::string>>;

// Indices into `tensors` in the order safetensors writes them.
std::vector<std::size_t> safetensors_write_order(std::span<const TensorSpec> tensors);

struct EncodedSafetensorsHeader {
  std::string bytes;               // the 8-byte length, the JSON and its padding
  std::vector<TensorInfo> layout;  // per tensor, in the order given: absolute offsets
  std::uint64_t file_size = 0;     // header plus data
};

// The header for `tensors` stored back to back in the order given. Throws
// std::invalid_argument for a tensor with no whole-byte size, a duplicate name, or a tensor
// named "__metadata__".
EncodedSafetensorsHeader encode_safetensors_header(
    std::span<const TensorSpec> tensors, const std::optional<SafetensorsMetadata>& metadata);

// Calls `fill` once per tensor, in order, with a buffer of exactly its size to fill; returns
// the written layout (absolute offsets). Tensors are stored in the order given (tests use this
// to lay files out by hand). Throws std::system_error naming the path on I/O errors.
std::vector<TensorInfo> write_safetensors(
    const std::filesystem::path& path, std::span<const TensorSpec> tensors,
    const std::function<void(const TensorSpec&, std::span<std::byte>)>& fill,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace ferry
