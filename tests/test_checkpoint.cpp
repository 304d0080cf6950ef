// Checkpoint::open: single files, shard directories with and without an index, and every way an
// index and its shards can disagree.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <future>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "ferry/checkpoint.hpp"
#include "ferry/error.hpp"
#include "ferry/ggml_type.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "gguf_bytes.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

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
const std::vector<TensorSpec> kShard1 = {{"embed", DType::BF16, {17, 33}},
                                         {"norm", DType::F32, {7}}};
const std::vector<TensorSpec> kShard2 = {
    {"layer.0.w", DType::F16, {8, 8}}, {"layer.0.b", DType::I64, {3}}, {"empty", DType::F32, {0}}};
const std::vector<TensorSpec> kShard3 = {{"head", DType::F4, {5, 2}},
                                         {"scale", DType::F8_E4M3, {1}}};
constexpr const char* kName1 = "model-00001-of-00003.safetensors";
constexpr const char* kName2 = "model-00002-of-00003.safetensors";
constexpr const char* kName3 = "model-00003-of-00003.safetensors";

std::map<std::string, std::string> weight_map_of(
    const std::vector<std::pair<const char*, const std::vector<TensorSpec>*>>& shards) {
  std::map<std::string, std::string> map;
  for (const auto& [file, specs] : shards)
    for (const auto& s : *specs) map[s.name] = file;
  return map;
}

// ---------------------------------------------------------------------------------------------
// Valid checkpoints

TEST_F(CheckpointTest, SingleFile) {
  const auto path = dir / "model.safetensors";
  const std::vector<TensorSpec> specs = {
      {"z", DType::U8, {3}}, {"a", DType::BF16, {4, 5}}, {"m", DType::C64, {2}}};
  write_safetensors(path, specs,
                    [&](const TensorSpec& s, std::span<std::byte> out) {
                      auto bytes = test::random_bytes(out.size(), s.name.size());
                      std::copy(bytes.begin(), bytes.end(), out.begin());
                      written[s.name] = std::move(bytes);
                    },
                    {{"format", "pt"}});

  const Checkpoint c = Checkpoint::open(path);
  EXPECT_EQ(c.path(), path);
  ASSERT_EQ(c.files().size(), 1u);
  EXPECT_EQ(c.files()[0].path, path);
  EXPECT_EQ(c.files()[0].size, fs::file_size(path));
  EXPECT_EQ(c.files()[0].metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  std::vector<std::string> names;
  for (const auto& t : c.tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"z", "a", "m"}));  // by offset, not by name
  EXPECT_EQ(c.find("a")->dtype, DType::BF16);
  EXPECT_EQ(c.find("a")->shape, (std::vector<std::uint64_t>{4, 5}));
  EXPECT_EQ(c.find("nope"), nullptr);
  expect_all_readable(c);
  expect_read_order(c);
}

TEST_F(CheckpointTest, SingleFileWithAnyExtension) {
  const auto path = dir / "weights.bin";
  shard(path, {{"w", DType::F32, {3}}});
  const Checkpoint c = Checkpoint::open(path);
  ASSERT_EQ(c.files().size(), 1u);
  expect_all_readable(c);
}

TEST_F(CheckpointTest, SingleFileWithNoTensors) {
  const auto path = dir / "empty.safetensors";
  test::write_file(path, test::raw_safetensors("{}", ""));
  const Checkpoint c = Checkpoint::open(path);
  EXPECT_EQ(c.files().size(), 1u);
  EXPECT_TRUE(c.tensors().empty());
  EXPECT_EQ(c.total_bytes(), 0u);
}

TEST_F(CheckpointTest, DirectoryOfShardsWithoutIndex) {
  // Written out of order; opened in sorted file-name order.
  shard(dir / "c.safetensors", kShard3);
  shard(dir / "a.safetensors", kShard1);
  shard(dir / "b.safetensors", kShard2);
  test::write_file(dir / "README.md", "not a shard");
  test::write_file(dir / "config.json", "{}");
  fs::create_directory(dir / "d.safetensors");  // a directory, not a shard

  const Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_EQ(c.path(), dir.path());
  ASSERT_EQ(c.files().size(), 3u);
  EXPECT_EQ(c.files()[0].path.filename(), "a.safetensors");
  EXPECT_EQ(c.files()[1].path.filename(), "b.safetensors");
  EXPECT_EQ(c.files()[2].path.filename(), "c.safetensors");
  for (const auto& f : c.files()) EXPECT_EQ(f.size, fs::file_size(f.path));
  for (const auto* specs : {&kShard1, &kShard2, &kShard3}) {
    const std::uint32_t expected = specs == &kShard1 ? 0 : specs == &kShard2 ? 1 : 2;
    for (const auto& s : *specs) EXPECT_EQ(c.find(s.name)->file_index, expected) << s.name;
  }
  expect_all_readable(c);
  expect_read_order(c);
}

TEST_F(CheckpointTest, DirectoryWithOneShard) {
  shard(dir / "model.safetensors", kShard1);
  const Checkpoint c = Checkpoint::open(dir.path());
  ASSERT_EQ(c.files().size(), 1u);
  expect_all_readable(c);
}

TEST_F(CheckpointTest, DirectoryWithIndex) {
  shard(dir / kName1, kShard1);
  shard(dir / kName2, kShard2);
  shard(dir / kName3, kShard3);
  index(weight_map_of({{kName1, &kShard1}, {kName2, &kShard2}, {kName3, &kShard3}}));

  const Checkpoint c = Checkpoint::open(dir.path());
  ASSERT_EQ(c.files().size(), 3u);
  for (const auto& s : kShard1) EXPECT_EQ(file_of(c, s.name), dir / kName1);
  for (const auto& s : kShard2) EXPECT_EQ(file_of(c, s.name), dir / kName2);
  for (const auto& s : kShard3) EXPECT_EQ(file_of(c, s.name), dir / kName3);
  expect_all_readable(c);
  expect_read_order(c);
}

TEST_F(CheckpointTest, ManyTensorsOverShardsAreEachFoundByName) {
  // Enough names that the flat name table wraps and collides; shards named "./x" and "x" alike.
  std::map<std::string, std::string> weight_map;
  for (int s = 0; s < 7; ++s) {
    std::vector<TensorSpec> specs;
    for (int i = 0; i < 3000; ++i)
      specs.push_back({"model.layers." + std::to_string(s * 3000 + i) + ".w", DType::U8, {1}});
    const std::string name = "model-" + std::to_string(s) + ".safetensors";
    shard(dir / name, specs);
    for (const auto& spec : specs)
      weight_map[spec.name] = (spec.name.size() % 2 ? "./" : "") + name;
  }
  index(weight_map);
  const Checkpoint c = Checkpoint::open(dir.path());
  ASSERT_EQ(c.files().size(), 7u);
  expect_all_readable(c);
  for (const char* absent :
       {"", "model", "model.layers.", "model.layers.21000.w", "model.layers.1.w "})
    EXPECT_EQ(c.find(absent), nullptr) << absent;
  const Checkpoint copy = c;  // a copy finds names in its own list
  EXPECT_EQ(copy.find("model.layers.20999.w"), &copy.tensors()[c.find("model.layers.20999.w") -
                                                                &c.tensors()[0]]);
}

TEST_F(CheckpointTest, IndexLeavesOtherSafetensorsFilesAlone) {
  shard(dir / kName1, kShard1);
  shard(dir / kName2, kShard2);
  index(weight_map_of({{kName1, &kShard1}, {kName2, &kShard2}}));
  // A stray file beside the index, even one repeating tensor names, is not part of it.
  write_safetensors(dir / "consolidated.safetensors", kShard1,
                    [](const TensorSpec&, std::span<std::byte>) {});

  const Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_EQ(c.files().size(), 2u);
  expect_all_readable(c);
}

TEST_F(CheckpointTest, IndexPathGivenDirectly) {
  shard(dir / kName1, kShard1);
  shard(dir / kName2, kShard2);
  const auto index_path = index(weight_map_of({{kName1, &kShard1}, {kName2, &kShard2}}));

  const Checkpoint c = Checkpoint::open(index_path);
  EXPECT_EQ(c.path(), index_path);
  ASSERT_EQ(c.files().size(), 2u);
  for (const auto& s : kShard1) EXPECT_EQ(file_of(c, s.name), dir / kName1);
  for (const auto& s : kShard2) EXPECT_EQ(file_of(c, s.name), dir / kName2);
  expect_all_readable(c);
}

TEST_F(CheckpointTest, IndexWithAnotherNameIsFoundInTheDirectory) {
  shard(dir / kName1, kShard1);
  index(weight_map_of({{kName1, &kShard1}}), "diffusion_pytorch_model.safetensors.index.json");
  const Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_EQ(c.files().size(), 1u);
  expect_all_readable(c);
}

TEST_F(CheckpointTest, IndexMayNameShardsInASubdirectory) {
  fs::create_directory(dir / "shards");
  shard(dir / "shards/one.safetensors", kShard1);
  index(weight_map_of({{"shards/one.safetensors", &kShard1}}));
  const Checkpoint c = Checkpoint::open(dir.path());
  ASSERT_EQ(c.files().size(), 1u);
  EXPECT_EQ(c.files()[0].path, dir / "shards/one.safetensors");
  expect_all_readable(c);
}

TEST_F(CheckpointTest, MetadataIsKeptPerFile) {
  write_safetensors(dir / "a.safetensors", kShard1, [](const TensorSpec&, std::span<std::byte>) {},
                    {{"shard", "a"}});
  write_safetensors(dir / "b.safetensors", kShard2, [](const TensorSpec&, std::span<std::byte>) {});
  const Checkpoint c = Checkpoint::open(dir.path());
  ASSERT_EQ(c.files().size(), 2u);
  EXPECT_EQ(c.files()[0].metadata.at("shard"), "a");
  EXPECT_TRUE(c.files()[1].metadata.empty());
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST_F(CheckpointTest, MissingPath) {
  const auto path = dir / "nope.safetensors";
  try {
    Checkpoint::open(path);
    FAIL() << "no error";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ENOENT);
    EXPECT_EQ(e.code(), std::errc::no_such_file_or_directory);
    EXPECT_THAT(e.what(), HasSubstr(path.string()));
  }
}

TEST_F(CheckpointTest, MissingIndexPath) {
  const auto path = dir / "model.safetensors.index.json";
  try {
    Checkpoint::open(path);
    FAIL() << "no error";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), std::errc::no_such_file_or_directory);
    EXPECT_THAT(e.what(), HasSubstr(path.string()));
  }
}

TEST_F(CheckpointTest, EmptyDirectory) {
  expect_format_error(dir.path(), {dir.path().string(), "no .safetensors files"});
}

TEST_F(CheckpointTest, DirectoryWithoutShards) {
  test::write_file(dir / "config.json", "{}");
  test::write_file(dir / "model.bin", "weights");
  expect_format_error(dir.path(), {dir.path().string(), "no .safetensors files"});
}

TEST_F(CheckpointTest, MalformedShardInDirectoryIsNamed) {
  shard(dir / "a.safetensors", kShard1);
  test::write_file(dir / "b.safetensors", test::raw_safetensors("[]", ""));
  expect_format_error(dir.path(), {(dir / "b.safetensors").string(), "not an object"});
}

TEST_F(CheckpointTest, SameTensorInTwoShardsWithoutIndex) {
  shard(dir / "a.safetensors", kShard1);
  shard(dir / "b.safetensors", {{"norm", DType::F32, {7}}});
  expect_format_error(dir.path(), {"\"norm\"", "appears in both", (dir / "a.safetensors").string(),
                                   (dir / "b.safetensors").string()});
}

TEST_F(CheckpointTest, SameTensorInTwoShardsWithIndex) {
  shard(dir / kName1, kShard1);
  shard(dir / kName2, {{"norm", DType::F32, {7}}, {"other", DType::U8, {1}}});
  index({{"embed", kName1}, {"norm", kName1}, {"other", kName2}});
  expect_format_error(dir.path(), {"\"norm\"", "appears in both", kName1, kName2});
}

TEST_F(CheckpointTest, IndexListsATensorNoShardHolds) {
  shard(dir / kName1, kShard1);
  auto map = weight_map_of({{kName1, &kShard1}});
  map["ghost"] = kName1;
  const auto index_path = index(map);
  expect_format_error(dir.path(), {index_path.string(), "\"ghost\"", "no shard holds it"});
}

TEST_F(CheckpointTest, ShardHoldsATensorTheIndexDoesNotList) {
  shard(dir / kName1, kShard1);
  shard(dir / kName2, kShard2);
  auto map = weight_map_of({{kName1, &kShard1}, {kName2, &kShard2}});
  map.erase("layer.0.b");
  const auto index_path = index(map);
  expect_format_error(
      dir.path(), {index_path.string(), (dir / kName2).string(), "\"layer.0.b\"", "does not list"});
}

TEST_F(CheckpointTest, IndexListsATensorInTheWrongShard) {
  shard(dir / kName1, kShard1);
  shard(dir / kName2, kShard2);
  auto map = weight_map_of({{kName1, &kShard1}, {kName2, &kShard2}});
  map["norm"] = kName2;  // held by shard 1
  const auto index_path = index(map);
  expect_format_error(dir.path(), {index_path.string(), "\"norm\"", "is listed in", kName2,
                                   "held by", (dir / kName1).string()});
}

TEST_F(CheckpointTest, IndexNamingAShardOutsideItsDirectory) {
  fs::create_directory(dir / "model");
  shard(dir / "outside.safetensors", kShard1);
  auto map = weight_map_of({{"../outside.safetensors", &kShard1}});
  test::write_file(dir / "model/model.safetensors.index.json", Json{{"weight_map", map}}.dump());
  expect_format_error(dir / "model", {(dir / "model/model.safetensors.index.json").string(),
                                      "../outside.safetensors", "not a file beside the index"});
}

TEST_F(CheckpointTest, IndexNamingAShardWithDotDotInside) {
  shard(dir / kName1, kShard1);
  const auto index_path = index({{"embed", std::string("sub/../") + kName1}});
  expect_format_error(index_path, {index_path.string(), "not a file beside the index"});
}

TEST_F(CheckpointTest, IndexNamingAnAbsolutePath) {
  shard(dir / kName1, kShard1);
  const auto absolute = (dir / kName1).string();
  const auto index_path = index({{"embed", absolute}, {"norm", absolute}});
  expect_format_error(index_path, {index_path.string(), absolute, "not a file beside the index"});
}

TEST_F(CheckpointTest, IndexNamingAnEmptyShard) {
  const auto index_path = index({{"embed", ""}});
  expect_format_error(index_path, {index_path.string(), "not a file beside the index"});
}

TEST_F(CheckpointTest, IndexNamingAMissingShard) {
  shard(dir / kName1, kShard1);
  auto map = weight_map_of({{kName1, &kShard1}});
  map["extra"] = "missing.safetensors";
  index(map);
  try {
    Checkpoint::open(dir.path());
    FAIL() << "no error";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), std::errc::no_such_file_or_directory);
    EXPECT_THAT(e.what(), HasSubstr((dir / "missing.safetensors").string()));
  }
}

// Runs `open` on a thread; where it is still blocked after a while, opens `fifo` for writing
// once, so that a reader stuck in open() or read() sees an end of file and the test can fail
// instead of hanging.
template <class Open>
void run_unblocking_fifo(const fs::path& fifo, Open open) {
  auto result = std::async(std::launch::async, open);
  if (result.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "still blocked on " << fifo << " after 20 s";
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  result.get();
}

TEST_F(CheckpointTest, IndexThatIsAFifoIsRefusedWithoutBlocking) {
  shard(dir / kName1, kShard1);
  const auto index_path = dir / "model.safetensors.index.json";
  ASSERT_EQ(::mkfifo(index_path.c_str(), 0600), 0) << std::strerror(errno);
  for (const fs::path& path : {dir.path(), index_path}) {
    run_unblocking_fifo(index_path, [&] {
      try {
        Checkpoint::open(path);
        ADD_FAILURE() << "no error opening " << path;
      } catch (const std::invalid_argument& e) {
        EXPECT_THAT(e.what(), HasSubstr(index_path.string()));
        EXPECT_THAT(e.what(), HasSubstr("not a regular file"));
      }
    });
  }
}

TEST_F(CheckpointTest, IndexThatLinksToADeviceIsRefused) {
  shard(dir / kName1, kShard1);
  const auto index_path = dir / "model.safetensors.index.json";
  fs::create_symlink("/dev/zero", index_path);
  try {
    Checkpoint::open(dir.path());
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr(index_path.string()));
    EXPECT_THAT(e.what(), HasSubstr("not a regular file"));
  }
}

TEST_F(CheckpointTest, IndexLargerThanTheLimitIsRefusedBeforeItIsRead) {
  const auto index_path = dir / "model.safetensors.index.json";
  test::write_file(index_path, "{");
  fs::resize_file(index_path, kSafetensorsMaxIndexBytes + 1);  // sparse: costs no disk
  expect_format_error(index_path,
                      {index_path.string(), std::to_string(kSafetensorsMaxIndexBytes + 1),
                       "exceeds the limit"});
}

// 200,000 distinct shard names: checked once each (a scan per name took minutes), and the
// first missing shard is the error.
TEST_F(CheckpointTest, IndexWithManyShardNamesFailsOnTheFirstMissingOne) {
  std::map<std::string, std::string> map;
  for (int i = 0; i < 200000; ++i)
    map["t" + std::to_string(i)] = "s" + std::to_string(i) + ".safetensors";
  index(map);
  auto result = std::async(std::launch::async, [&] {
    try {
      Checkpoint::open(dir.path());
      ADD_FAILURE() << "no error";
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), std::errc::no_such_file_or_directory);
      EXPECT_THAT(e.what(), HasSubstr("s0.safetensors"));
    }
  });
  // Not a timing assertion: a bound on a hang (the quadratic check took minutes).
  ASSERT_EQ(result.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "checking 200,000 shard names took over a minute";
}

TEST_F(CheckpointTest, NulInsideAnIndexEntryIsRefused) {
  shard(dir / kName1, kShard1);
  auto map = weight_map_of({{kName1, &kShard1}});
  map[std::string("embed\0x", 7)] = kName1;
  auto index_path = index(map);
  expect_format_error(index_path, {index_path.string(), "embed\\0", "NUL"});
  map = weight_map_of({{kName1, &kShard1}});
  map["embed"] = std::string(kName1) + std::string("\0.txt", 5);
  index_path = index(map);
  expect_format_error(index_path, {index_path.string(), "\\0.txt", "NUL"});
}

TEST_F(CheckpointTest, NulInsideAPathIsRefused) {
  shard(dir / kName1, kShard1);
  const std::string path = (dir / kName1).string() + std::string("\0.other", 7);
  try {
    Checkpoint::open(path);
    FAIL() << "opened " << path.c_str() << " as if the NUL ended it";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("NUL"));
  }
}

TEST_F(CheckpointTest, IndexNotValidJson) {
  shard(dir / kName1, kShard1);
  const auto index_path = dir / "model.safetensors.index.json";
  test::write_file(index_path, R"({"weight_map": {"embed": )");
  expect_format_error(dir.path(), {index_path.string(), "not valid JSON"});
  expect_format_error(index_path, {index_path.string(), "not valid JSON"});
}

TEST_F(CheckpointTest, IndexWithoutWeightMap) {
  shard(dir / kName1, kShard1);
  const auto index_path = dir / "model.safetensors.index.json";
  test::write_file(index_path, R"({"metadata": {"total_size": 10}})");
  expect_format_error(dir.path(), {index_path.string(), "weight_map"});
}

TEST_F(CheckpointTest, IndexNotAnObject) {
  const auto index_path = dir / "model.safetensors.index.json";
  test::write_file(index_path, R"(["weight_map"])");
  expect_format_error(index_path, {index_path.string(), "weight_map"});
}

TEST_F(CheckpointTest, IndexWeightMapNotAnObject) {
  const auto index_path = dir / "model.safetensors.index.json";
  test::write_file(index_path, R"({"weight_map": [["embed", "a.safetensors"]]})");
  expect_format_error(index_path, {index_path.string(), "weight_map"});
}

TEST_F(CheckpointTest, IndexWithEmptyWeightMap) {
  const auto index_path = index({});
  expect_format_error(index_path, {index_path.string(), "weight_map is empty"});
}

TEST_F(CheckpointTest, IndexShardNameNotAString) {
  const auto index_path = dir / "model.safetensors.index.json";
  test::write_file(index_path, R"({"weight_map": {"embed": 1}})");
  expect_format_error(index_path, {index_path.string(), "\"embed\"", "not a file name"});
}

TEST_F(CheckpointTest, SeveralIndexFilesAreAmbiguous) {
  shard(dir / kName1, kShard1);
  index(weight_map_of({{kName1, &kShard1}}), "a.safetensors.index.json");
  index(weight_map_of({{kName1, &kShard1}}), "b.safetensors.index.json");
  expect_format_error(dir.path(), {dir.path().string(), "several"});
}

// Two shards with the same file name in different subdirectories: the index must be checked
// against the shard's path, not only its file name.
// DISABLED: src/format/checkpoint.cpp compares held_by.filename() with the listed shard's filename(), so
// this swapped index is accepted (see the report that came with this test).
TEST_F(CheckpointTest, IndexListingATensorInASameNamedShardElsewhere) {
  fs::create_directory(dir / "a");
  fs::create_directory(dir / "b");
  shard(dir / "a/x.safetensors", {{"t1", DType::U8, {1}}});
  shard(dir / "b/x.safetensors", {{"t2", DType::U8, {1}}});
  const auto index_path = index({{"t1", "b/x.safetensors"}, {"t2", "a/x.safetensors"}});
  expect_format_error(index_path, {index_path.string(), "is listed in"});
}

// ---------------------------------------------------------------------------------------------
// GGUF checkpoints (the reader's own defects are in test_gguf.cpp), through the plan and the
// engine as safetensors go

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
