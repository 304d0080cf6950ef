// A sharded checkpoint's index (model.safetensors.index.json): {"weight_map": {tensor: shard}}.
// Shards must sit beside the index; names are normalised so that "./a" and "a" name one shard.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ferry::detail {

struct SafetensorsIndex {
  std::vector<std::string> shards;  // in first-mention order
  // (tensor, its shard's position in `shards`) in the index's order; each tensor once (the
  // strict parser refuses a repeated key).
  std::vector<std::pair<std::string, std::uint32_t>> shard_of_tensor;
};

// Throws FormatError naming `label` for anything but a weight_map of shards beside the index.
SafetensorsIndex parse_safetensors_index(std::string_view text, std::string_view label);

// Reads and parses the index at `path`.
SafetensorsIndex read_safetensors_index(const std::filesystem::path& path);

}  // namespace ferry::detail
