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
#include "checkpoint_fixture.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

using namespace checkpoint_test;  // the fixture, its shards and their names

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

}  // namespace
}  // namespace ferry
