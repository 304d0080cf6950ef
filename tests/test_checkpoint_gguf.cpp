// Checkpoint::open on GGUF files and split GGUF directories (the reader's own defects are in
// test_gguf.cpp), loaded through the plan and the engine as safetensors go, and what it refuses.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint_fixture.hpp"
#include "ferry/checkpoint.hpp"
#include "ferry/error.hpp"
#include "ferry/ggml_type.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "gguf_bytes.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

using namespace checkpoint_test;  // the fixture, its shards and their names

constexpr std::uint32_t kF32 = 0, kQ8_0 = 8, kQ4_K = 12;  // ggml type ids

class GgufCheckpointTest : public CheckpointTest {
 protected:
  // A model-like file: a plain tensor and quantized ones, random bytes, 32-byte aligned.
  fs::path model(const std::string& name, const std::string& prefix, std::uint64_t seed) {
    test::GgufBytes f;
    using test::gstr, test::kv, test::tensor_info, test::u32;
    f.kvs = {kv("general.architecture", GgufValueType::String, gstr("llama")),
             kv(prefix + "count", GgufValueType::Uint32, u32(3))};
    const std::vector<std::pair<std::vector<std::uint64_t>, std::uint32_t>> specs = {
        {{64}, kF32}, {{256, 3}, kQ4_K}, {{64, 5}, kQ8_0}};
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const auto& [dims, type] = specs[i];
      const auto* traits = find_ggml_type(type);
      std::uint64_t bytes = dims[0] / traits->block_size * traits->type_size;
      for (std::size_t d = 1; d < dims.size(); ++d) bytes *= dims[d];
      f.tensors.push_back(tensor_info(prefix + std::to_string(i), dims, type, f.data.size()));
      const auto random = test::random_bytes(bytes, seed + i);
      f.data.append(reinterpret_cast<const char*>(random.data()), random.size());
      f.data.append((32 - f.data.size() % 32) % 32, '\0');
    }
    test::write_file(dir / name, f.build());
    return dir / name;
  }

  void expect_loads(const Checkpoint& c) {
    auto shared = std::make_shared<const Checkpoint>(c);
    const LoadedCheckpoint loaded = load(shared, LoadOptions{});
    ASSERT_EQ(loaded.tensors().size(), c.tensors().size());
    for (const auto& t : loaded.tensors()) {
      SCOPED_TRACE(t.info->name);
      const auto expected = test::read_plain(c, *t.info);
      ASSERT_EQ(std::memcmp(t.data, expected.data(), expected.size()), 0);
    }
    EXPECT_EQ(loaded.stats().tensor_bytes, c.total_bytes());
  }
};

TEST_F(GgufCheckpointTest, OneFile) {
  const auto path = model("model.gguf", "t.", 1);
  const Checkpoint c = Checkpoint::open(path);
  EXPECT_EQ(c.format(), CheckpointFormat::Gguf);
  ASSERT_EQ(c.files().size(), 1u);
  const auto& f = c.files()[0];
  EXPECT_EQ(f.format, CheckpointFormat::Gguf);
  EXPECT_EQ(f.gguf_version, 3u);
  EXPECT_EQ(f.gguf_alignment, 32u);
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"general.architecture", "llama"},
                                                            {"t.count", "3"}}));
  EXPECT_EQ(nlohmann::json::parse(f.metadata_json())["t.count"]["type"], "UINT32");
  ASSERT_EQ(c.tensors().size(), 3u);
  EXPECT_EQ(c.find("t.1")->shape, (std::vector<std::uint64_t>{3, 144}));
  EXPECT_EQ(c.find("t.1")->ggml_type, kQ4_K);
  expect_loads(c);
}

TEST_F(GgufCheckpointTest, DetectedByMagicWithoutExtension) {
  // Ollama keeps models as blobs named by digest.
  const auto path = model("sha256-0123abcd", "t.", 2);
  const Checkpoint c = Checkpoint::open(path);
  EXPECT_EQ(c.format(), CheckpointFormat::Gguf);
  expect_loads(c);
}

TEST_F(GgufCheckpointTest, SplitFilesInADirectory) {
  model("model-00002-of-00002.gguf", "b.", 3);
  model("model-00001-of-00002.gguf", "a.", 4);
  const Checkpoint c = Checkpoint::open(dir.path());
  ASSERT_EQ(c.files().size(), 2u);
  EXPECT_EQ(c.files()[0].path.filename(), "model-00001-of-00002.gguf");
  EXPECT_EQ(c.tensors().front().name, "a.0");
  EXPECT_EQ(c.tensors().back().name, "b.2");
  expect_loads(c);
}

TEST_F(GgufCheckpointTest, SplitDirectoryMissingAMiddlePartIsRefused) {
  model("model-00001-of-00003.gguf", "a.", 3);
  model("model-00003-of-00003.gguf", "c.", 4);
  expect_format_error(dir.path(), {(dir / "model-00002-of-00003.gguf").string(), "missing",
                                   "part 2 of 3"});
}

TEST_F(GgufCheckpointTest, SplitDirectoryMissingTheLastPartIsRefused) {
  model("model-00001-of-00002.gguf", "a.", 3);
  expect_format_error(dir.path(), {(dir / "model-00002-of-00002.gguf").string(), "missing"});
}

// Renamed parts: their split.count still says how many there are.
TEST_F(GgufCheckpointTest, SplitCountDisagreeingWithTheDirectoryIsRefused) {
  test::GgufBytes f;
  f.kvs = {test::kv("split.count", GgufValueType::Uint16, test::le(3, 2))};
  test::write_file(dir / "first.gguf", f.build());
  model("second.gguf", "b.", 4);
  expect_format_error(dir.path(), {(dir / "first.gguf").string(), "split.count is 3", "holds 2"});
}

TEST_F(GgufCheckpointTest, DirectoryMixingFormatsIsRefused) {
  model("model.gguf", "t.", 5);
  test::write_file(dir / "model.safetensors", test::raw_safetensors("{}", ""));
  expect_format_error(dir.path(), {dir.path().string(), "mixes .safetensors and .gguf"});
}

TEST_F(GgufCheckpointTest, GgufExtensionWithoutTheMagicIsAGgufError) {
  const auto path = dir / "fake.gguf";
  test::write_file(path, test::raw_safetensors("{}", ""));
  expect_format_error(path, {path.string(), "bad magic"});
}

// An index naming a GGUF file (no extension to tell) among safetensors shards.
TEST_F(GgufCheckpointTest, IndexListingAGgufFileIsRefused) {
  shard(dir / kName1, kShard1);
  model("other.bin", "t.", 6);
  auto map = weight_map_of({{kName1, &kShard1}});
  map["t.0"] = "other.bin";
  const auto index_path = index(map);
  expect_format_error(index_path, {"other.bin", "a gguf file in a safetensors checkpoint"});
}

TEST_F(GgufCheckpointTest, SafetensorsFilesAreUnchanged) {
  const auto path = dir / "m.safetensors";
  shard(path, {{"w", DType::F32, {3}}});
  const Checkpoint c = Checkpoint::open(path);
  EXPECT_EQ(c.format(), CheckpointFormat::Safetensors);
  EXPECT_EQ(c.tensors()[0].ggml_type, -1);
  EXPECT_TRUE(c.tensors()[0].ggml_dims.empty());
  EXPECT_TRUE(c.files()[0].metadata_json().empty());
  EXPECT_EQ(c.files()[0].data_start, c.tensors()[0].offset);
}

}  // namespace
}  // namespace ferry
