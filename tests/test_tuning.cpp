// The tuning file: what `ferry doctor --tune` writes and every load reads.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <future>

#include "ferry/error.hpp"
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

// Loads keep an unchanged tuning file's settings; a file replaced (as --tune writes it), or
// rewritten in place to another size, or removed, takes effect at the next load.
TEST_F(TuningFile, AChangedFileTakesEffectAtTheNextLoad) {
  write_tuning(file(), example(this_machine()));
  ASSERT_TRUE(active_tuning().tuning);
  EXPECT_EQ(active_tuning().tuning->chunk_bytes, 64u << 10);
  Tuning other = example(this_machine());
  other.chunk_bytes = 128 << 10;
  write_tuning(file(), other);
  ASSERT_TRUE(active_tuning().tuning);
  EXPECT_EQ(active_tuning().tuning->chunk_bytes, 128u << 10);
  {
    std::ofstream in_place(file(), std::ios::trunc);
    in_place << "{ not json";
  }
  const ActiveTuning broken = active_tuning();
  EXPECT_FALSE(broken.tuning);
  EXPECT_NE(broken.source.find(file().string()), std::string::npos) << broken.source;
  std::filesystem::remove(file());
  EXPECT_NE(active_tuning().source.find("no tuning file"), std::string::npos);
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
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(file().string()), std::string::npos) << e.what();
    }
    // ...but it never stops a load: the defaults apply and the statistics say why.
    const LoadStats stats = load(checkpoint(), LoadOptions{}).stats();
    EXPECT_NE(stats.settings_source.find("built-in defaults"), std::string::npos) << text;
    EXPECT_NE(stats.settings_source.find(file().string()), std::string::npos)
        << stats.settings_source;
    EXPECT_NE(stats.settings_source.find("not a usable ferry tuning file"), std::string::npos)
        << stats.settings_source;
  }
}

// The defaults, and a source that names the file and says `why`; a load goes ahead.
void expect_defaults_because(const std::filesystem::path& file, const std::string& why,
                             const std::shared_ptr<const Checkpoint>& ckpt) {
  const ActiveTuning active = active_tuning();
  EXPECT_FALSE(active.tuning);
  EXPECT_NE(active.source.find("built-in defaults"), std::string::npos) << active.source;
  EXPECT_NE(active.source.find(file.string()), std::string::npos) << active.source;
  EXPECT_NE(active.source.find(why), std::string::npos) << active.source;
  const LoadStats stats = load(ckpt, LoadOptions{}).stats();
  EXPECT_EQ(stats.settings_source, active.source);
}

TEST_F(TuningFile, ADirectoryThereMeansTheDefaults) {
  auto ckpt = checkpoint();
  std::filesystem::create_directories(file());
  expect_defaults_because(file(), "not a regular file", ckpt);
}

TEST_F(TuningFile, AFifoThereMeansTheDefaultsWithoutBlocking) {
  auto ckpt = checkpoint();
  std::filesystem::create_directories(file().parent_path());
  ASSERT_EQ(::mkfifo(file().c_str(), 0600), 0) << std::strerror(errno);
  auto result = std::async(std::launch::async, [&] {
    expect_defaults_because(file(), "not a regular file", ckpt);
  });
  if (result.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "still blocked on the FIFO after 20 s";
    const int fd = ::open(file().c_str(), O_WRONLY | O_NONBLOCK);  // lets the reader go on
    if (fd >= 0) ::close(fd);
  }
  result.get();
}

TEST_F(TuningFile, AnUnreadableDirectoryMeansTheDefaults) {
  auto ckpt = checkpoint();
  write_tuning(file(), example(this_machine()));
  std::filesystem::permissions(file().parent_path(), std::filesystem::perms::none);
  const bool readable = ::access(file().c_str(), R_OK) == 0;  // root reads it anyway
  if (!readable) expect_defaults_because(file(), "Permission denied", ckpt);
  std::filesystem::permissions(file().parent_path(), std::filesystem::perms::owner_all);
  if (readable) GTEST_SKIP() << "this user reads files whatever their permissions (root)";
}

TEST_F(TuningFile, XdgCacheHomeThatIsAFileMeansTheDefaults) {
  ::unsetenv("FERRY_TUNING_FILE");
  const auto cache = _dir / "cache";
  test::write_file(cache, "not a directory");
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old ? old : "";
  ::setenv("XDG_CACHE_HOME", cache.c_str(), 1);
  const ActiveTuning active = active_tuning();
  if (old) ::setenv("XDG_CACHE_HOME", saved.c_str(), 1); else ::unsetenv("XDG_CACHE_HOME");
  EXPECT_FALSE(active.tuning);
  EXPECT_NE(active.source.find("built-in defaults"), std::string::npos) << active.source;
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
