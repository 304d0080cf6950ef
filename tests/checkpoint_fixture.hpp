// The fixture of the Checkpoint::open tests (test_checkpoint.cpp, test_checkpoint_gguf.cpp): shards
// of random bytes, Hugging Face's index beside them, and the checks every case makes.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "ferry/checkpoint.hpp"
#include "ferry/error.hpp"
#include "test_support.hpp"

namespace ferry::checkpoint_test {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Json = nlohmann::json;
using Written = std::map<std::string, std::vector<std::byte>>;

class CheckpointTest : public ::testing::Test {
 protected:
  // Writes a shard with random bytes and remembers them for read-back checks.
  void shard(const fs::path& path, const std::vector<TensorSpec>& specs) {
    // Not test::write_random_checkpoint: its memcpy of an empty tensor passes null (UBSan).
    write_safetensors(path, specs, [&](const TensorSpec& s, std::span<std::byte> out) {
      auto bytes = test::random_bytes(out.size(), ++seed);
      std::copy(bytes.begin(), bytes.end(), out.begin());
      written[s.name] = std::move(bytes);
    });
  }

  // An index in Hugging Face's layout, written beside its shards.
  fs::path index(const std::map<std::string, std::string>& weight_map,
                 const std::string& name = "model.safetensors.index.json") {
    Json root = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
    const auto path = dir / name;
    test::write_file(path, root.dump(2));
    return path;
  }

  // Every tensor is found by name and its bytes are the ones written.
  void expect_all_readable(const Checkpoint& c) {
    EXPECT_EQ(c.tensors().size(), written.size());
    std::uint64_t total = 0;
    for (const auto& [name, bytes] : written) {
      SCOPED_TRACE(name);
      const TensorInfo* t = c.find(name);
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(t->name, name);
      EXPECT_EQ(t->size, bytes.size());
      ASSERT_LT(t->file_index, c.files().size());
      EXPECT_EQ(test::read_plain(c, *t), bytes);
      total += bytes.size();
    }
    EXPECT_EQ(c.total_bytes(), total);
  }

  // Read order: by file, then by offset, without overlaps.
  static void expect_read_order(const Checkpoint& c) {
    for (std::size_t i = 1; i < c.tensors().size(); ++i) {
      const auto& a = c.tensors()[i - 1];
      const auto& b = c.tensors()[i];
      EXPECT_TRUE(a.file_index < b.file_index ||
                  (a.file_index == b.file_index && a.offset + a.size <= b.offset))
          << a.name << " then " << b.name;
    }
  }

  const fs::path& file_of(const Checkpoint& c, const std::string& tensor) {
    const TensorInfo* t = c.find(tensor);
    if (t == nullptr) throw std::runtime_error("no tensor " + tensor);
    return c.files()[t->file_index].path;
  }

  // Opening must throw a FormatError whose message says every one of `words`.
  static void expect_format_error(const fs::path& path, const std::vector<std::string>& words) {
    try {
      Checkpoint::open(path);
      ADD_FAILURE() << "no FormatError opening " << path;
    } catch (const FormatError& e) {
      for (const auto& word : words) EXPECT_THAT(e.what(), HasSubstr(word));
    }
  }

  test::TempDir dir;
  Written written;
  std::uint64_t seed = 0;
};

// Three shards in the layout Hugging Face writes, and their index.
inline const std::vector<TensorSpec> kShard1 = {{"embed", DType::BF16, {17, 33}},
                                         {"norm", DType::F32, {7}}};
inline const std::vector<TensorSpec> kShard2 = {
    {"layer.0.w", DType::F16, {8, 8}}, {"layer.0.b", DType::I64, {3}}, {"empty", DType::F32, {0}}};
inline const std::vector<TensorSpec> kShard3 = {{"head", DType::F4, {5, 2}},
                                         {"scale", DType::F8_E4M3, {1}}};
inline constexpr const char* kName1 = "model-00001-of-00003.safetensors";
inline constexpr const char* kName2 = "model-00002-of-00003.safetensors";
inline constexpr const char* kName3 = "model-00003-of-00003.safetensors";

inline std::map<std::string, std::string> weight_map_of(
    const std::vector<std::pair<const char*, const std::vector<TensorSpec>*>>& shards) {
  std::map<std::string, std::string> map;
  for (const auto& [file, specs] : shards)
    for (const auto& s : *specs) map[s.name] = file;
  return map;
}

}  // namespace ferry::checkpoint_test
