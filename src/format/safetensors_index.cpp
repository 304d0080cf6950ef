#include "format/safetensors_index.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "ferry/checkpoint.hpp"
#include "ferry/error.hpp"
#include "format/strict_json.hpp"
#include "platform/file_descriptor.hpp"

namespace ferry::detail {
namespace {

namespace fs = std::filesystem;

// An index nests three levels deep (root, weight_map or metadata, value).
constexpr int kMaxIndexDepth = 8;

// A name for a message: a NUL shows as \0.
std::string printable_name(std::string_view name) {
  std::string out;
  for (char c : name) out += c == '\0' ? std::string("\\0") : std::string(1, c);
  return out;
}

}  // namespace

SafetensorsIndex parse_safetensors_index(std::string_view text, std::string_view label) {
  nlohmann::json root = parse_strict_json(text, label, kMaxIndexDepth);
  FERRY_FORMAT_EXPECT(
      root.is_object() && root.contains("weight_map") && root["weight_map"].is_object(), label,
      ": no \"weight_map\" object");
  SafetensorsIndex index;
  // Each distinct shard text is checked and normalised once: indexes list 100,000s of names
  // over a few shards.
  std::unordered_map<std::string, std::uint32_t> position_of_text;
  std::unordered_map<std::string, std::uint32_t> position_of_name;
  const auto& weight_map = root["weight_map"].get_ref<const nlohmann::json::object_t&>();
  index.shard_of_tensor.reserve(weight_map.size());
  for (const auto& [tensor, shard] : weight_map) {
    // C strings end at a NUL: "a\0b" would read as "a" through the C ABI and in open().
    FERRY_FORMAT_EXPECT(tensor.find('\0') == std::string::npos, label, ": weight_map entry \"",
                        printable_name(tensor), "\" holds a NUL character");
    FERRY_FORMAT_EXPECT(shard.is_string(), label, ": weight_map entry \"", tensor,
                        "\" is not a file name");
    const std::string& shard_text = shard.get_ref<const std::string&>();
    if (const auto known = position_of_text.find(shard_text); known != position_of_text.end()) {
      index.shard_of_tensor.emplace_back(tensor, known->second);
      continue;
    }
    FERRY_FORMAT_EXPECT(shard_text.find('\0') == std::string::npos, label, ": weight_map entry \"",
                        tensor, "\" names \"", printable_name(shard_text),
                        "\", which holds a NUL character");
    const fs::path raw(shard_text);
    // Shards must sit beside the index: no absolute paths, no ".." anywhere (a symlinked
    // directory makes "sub/.." lead elsewhere). Normalised, "./a" and "a" name one shard.
    FERRY_FORMAT_EXPECT(
        !raw.empty() && raw.is_relative() &&
            std::none_of(raw.begin(), raw.end(), [](const fs::path& part) { return part == ".."; }),
        label, ": weight_map entry \"", tensor, "\" names \"", raw.string(),
        "\", which is not a file beside the index");
    const std::string name = raw.lexically_normal().string();
    const auto [at, added] =
        position_of_name.emplace(name, static_cast<std::uint32_t>(index.shards.size()));
    if (added) index.shards.push_back(name);
    position_of_text.emplace(shard_text, at->second);
    index.shard_of_tensor.emplace_back(tensor, at->second);
  }
  FERRY_FORMAT_EXPECT(!index.shards.empty(), label, ": weight_map is empty");
  return index;
}

SafetensorsIndex read_safetensors_index(const fs::path& path) {
  const std::string label = path.string();
  // Opened without blocking and checked before reading: a FIFO would block forever and
  // /dev/zero would never end.
  const FileDescriptor fd = open_for_reading(path);
  const std::uint64_t size = file_size(fd, path);
  FERRY_FORMAT_EXPECT(size <= kSafetensorsMaxIndexBytes, label, ": index of ", size,
                      " bytes exceeds the limit of ", kSafetensorsMaxIndexBytes,
                      " bytes (not a safetensors index?)");
  try {
    std::string text(size, '\0');
    read_exact(fd, text.data(), size, 0, path);
    return parse_safetensors_index(text, label);
  } catch (const std::bad_alloc&) {
    throw OutOfMemory(label + ": out of memory while reading this " + std::to_string(size) +
                      "-byte index");
  }
}

}  // namespace ferry::detail
