// The tuning file: what `ferry doctor --tune` writes and every load reads.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>

#include "ferry/loaded_checkpoint.hpp"
#include "ferry/tuning.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

using test::TempDir;

// Points FERRY_TUNING_FILE at a file of a temporary directory for one test.
class TuningFile : public ::testing::Test {
 protected:
  void SetUp() override { ::setenv("FERRY_TUNING_FILE", file().c_str(), 1); }
  void TearDown() override { ::unsetenv("FERRY_TUNING_FILE"); }
  std::filesystem::path file() const { return _dir / "ferry" / "tuning.json"; }
  std::shared_ptr<const Checkpoint> checkpoint(std::uint64_t bytes = 3 << 20) {
    test::write_random_checkpoint(_dir / "m.safetensors", {{"w", DType::U8, {bytes}}}, 5);
    return Checkpoint::open_shared(_dir / "m.safetensors");
  }
  TempDir _dir;
};

Tuning example(std::string machine) {
  return {3, 64 << 10, 3, std::move(machine), "2026-11-22T00:00:00Z", 12.5, "m.safetensors"};
}

TEST_F(TuningFile, NoFileMeansBuiltInDefaultsAndSaysHowToMeasure) {
  EXPECT_EQ(tuning_file(), file());
  EXPECT_FALSE(read_tuning(file()));
  const ActiveTuning active = active_tuning();
  EXPECT_FALSE(active.tuning);
  EXPECT_NE(active.source.find("built-in defaults"), std::string::npos);
  EXPECT_NE(active.source.find("--tune"), std::string::npos);
}

TEST_F(TuningFile, WrittenAndReadBack) {
  write_tuning(file(), example(this_machine()));
  const auto t = read_tuning(file());
  ASSERT_TRUE(t);
  EXPECT_EQ(t->reader_threads, 3u);
  EXPECT_EQ(t->chunk_bytes, 64u << 10);
  EXPECT_EQ(t->slots_per_thread, 3u);
  EXPECT_EQ(t->machine, this_machine());
  EXPECT_DOUBLE_EQ(t->gigabytes_per_second, 12.5);
}

TEST_F(TuningFile, LoadsUseItUnlessTheCallerChooses) {
  auto ckpt = checkpoint();
  write_tuning(file(), example(this_machine()));
  const LoadStats tuned = load(ckpt, LoadOptions{}).stats();
  EXPECT_EQ(tuned.reader_threads, 3u);
  EXPECT_EQ(tuned.chunk_bytes, 64u << 10);
  EXPECT_EQ(tuned.slots_per_thread, 3u);
  EXPECT_NE(tuned.settings_source.find(file().string()), std::string::npos);

  LoadOptions mine;
  mine.reader_threads = 2;
  mine.chunk_bytes = 128 << 10;
  mine.slots_per_thread = 2;
  const LoadStats chosen = load(ckpt, mine).stats();
  EXPECT_EQ(chosen.reader_threads, 2u);
  EXPECT_EQ(chosen.chunk_bytes, 128u << 10);
  EXPECT_EQ(chosen.settings_source, "given by the caller");
}

TEST_F(TuningFile, AnotherMachinesTuningIsNotUsed) {
  auto ckpt = checkpoint();
  write_tuning(file(), example("999 cores, some other GPU"));
  const LoadStats stats = load(ckpt, LoadOptions{}).stats();
  EXPECT_NE(stats.chunk_bytes, 64u << 10);
  EXPECT_NE(stats.settings_source.find("999 cores, some other GPU"), std::string::npos);
}

TEST_F(TuningFile, MalformedFilesAreErrorsNamingTheFile) {
  const char* bad[] = {
      "{not json",
      R"({"chunk_bytes": 65536, "slots_per_thread": 2, "machine": "x"})",
      R"({"reader_threads": 4, "chunk_bytes": 1000, "slots_per_thread": 2, "machine": "x"})",
      R"({"reader_threads": 0, "chunk_bytes": 65536, "slots_per_thread": 2, "machine": "x"})",
      R"({"reader_threads": 4, "chunk_bytes": 65536, "slots_per_thread": 99, "machine": "x"})",
      R"({"reader_threads": "four", "chunk_bytes": 65536, "slots_per_thread": 2, "machine": "x"})",
  };
  std::filesystem::create_directories(file().parent_path());
  for (const char* text : bad) {
    std::ofstream(file()) << text;
    try {
      read_tuning(file());
      ADD_FAILURE() << "accepted: " << text;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(file().string()), std::string::npos) << e.what();
    }
    EXPECT_THROW(load(checkpoint(), LoadOptions{}), std::invalid_argument) << text;
  }
}

TEST_F(TuningFile, TuneMeasuresEveryCandidateAndKeepsOne) {
  auto ckpt = checkpoint(6 << 20);
  std::vector<Tuning> seen;
  const Tuning best = tune(ckpt, Device::cpu(), 1, [&](const Tuning& t) { seen.push_back(t); });
  ASSERT_GE(seen.size(), 6u);  // 3 read sizes x 2 slot counts for each thread count
  bool among = false;
  for (const auto& t : seen) {
    EXPECT_GT(t.gigabytes_per_second, 0);
    among |= t.reader_threads == best.reader_threads && t.chunk_bytes == best.chunk_bytes &&
             t.slots_per_thread == best.slots_per_thread;
  }
  EXPECT_TRUE(among);
  EXPECT_EQ(best.machine, this_machine());
  EXPECT_THROW(tune(ckpt, Device::cpu(), 0), std::invalid_argument);
}

}  // namespace
}  // namespace ferry
