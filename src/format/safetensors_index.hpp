// A sharded checkpoint's index (model.safetensors.index.json): {"weight_map": {tensor: shard}}.
// Shards must sit beside the index; names are normalised so that "./a" and "a" name one shard.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::detail {

struct SafetensorsIndex {
  std::vector<std::string> shards;                      // in first-mention order
  std::map<std::string, std::string> shard_of_tensor;  // tensor -> shard file name
};

// Throws FormatError naming `label` for anything but a weight_map of shards beside the index.
SafetensorsIndex parse_safetensors_index(std::string_view text, std::string_view label);

// Reads and parses the index at `path`.
SafetensorsIndex read_safetensors_index(const std::filesystem::path& path);

}  // namespace ferry::detail
