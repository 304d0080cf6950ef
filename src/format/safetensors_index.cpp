#include "format/safetensors_index.hpp"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "ferry/error.hpp"
#include "format/strict_json.hpp"

namespace ferry::detail {
namespace {

namespace fs = std::filesystem;

// An index nests three levels deep (root, weight_map or metadata, value).
constexpr int kMaxIndexDepth = 8;

}  // namespace

SafetensorsIndex parse_safetensors_index(std::string_view text, std::string_view label) {
  nlohmann::json root = parse_strict_json(text, label, kMaxIndexDepth);
  FERRY_FORMAT_EXPECT(root.is_object() && root.contains("weight_map") &&
                          root["weight_map"].is_object(),
                      label, ": no \"weight_map\" object");
  SafetensorsIndex index;
  for (const auto& [tensor, shard] : root["weight_map"].items()) {
    FERRY_FORMAT_EXPECT(shard.is_string(), label, ": weight_map entry \"", tensor,
                        "\" is not a file name");
    const fs::path raw(shard.get<std::string>());
    // Shards must sit beside the index: no absolute paths, no ".." anywhere (a symlinked
    // directory makes "sub/.." lead elsewhere). Normalised, "./a" and "a" name one shard.
    FERRY_FORMAT_EXPECT(!raw.empty() && raw.is_relative() &&
                            std::none_of(raw.begin(), raw.end(), [](const fs::path& part) {
                              return part == "..";
                            }),
                        label, ": weight_map entry \"", tensor, "\" names \"", raw.string(),
                        "\", which is not a file beside the index");
    const std::string name = raw.lexically_normal().string();
    if (std::find(index.shards.begin(), index.shards.end(), name) == index.shards.end())
      index.shards.push_back(name);
    index.shard_of_tensor[tensor] = name;
  }
  FERRY_FORMAT_EXPECT(!index.shards.empty(), label, ": weight_map is empty");
  return index;
}

SafetensorsIndex read_safetensors_index(const fs::path& path) {
  const std::string label = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_errno(errno, label);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_safetensors_index(text, label);
}

}  // namespace ferry::detail
