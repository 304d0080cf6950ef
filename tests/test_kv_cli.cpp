// `ferry kv stats`, `verify` and `bench` on stores made here (the CLI as a user runs it).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kv_test_support.hpp"

namespace ferry::test {
namespace {

// Runs the CLI; returns its exit status and output (stdout and stderr).
std::pair<int, std::string> run_cli(const std::string& arguments) {
  const std::string command = std::string(FERRY_CLI) + " " + arguments + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string out;
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(KvCli, StatsAndVerifyReportEveryStoreAndCatchACorruptBlock) {
  TempDir dir;
  KVStoreOptions one_slab;
  one_slab.slab_count = 1;
  {
    auto a = KVStore::open(dir.path(), kv_namespace("model-a"), 8 * 4096, 4096, one_slab);
    auto b = KVStore::open(dir.path(), kv_namespace("model-b"), 8 * 4096, 4096);
    for (KVKey k = 1; k <= 3; ++k) ASSERT_TRUE(put_one(a, k, kv_bytes(k, 4096)).ok());
    ASSERT_TRUE(put_one(b, 9, kv_bytes(9, 100)).ok());
  }
  auto [status, out] = run_cli("kv stats " + dir.path().string());
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("model=model-a"), std::string::npos) << out;
  EXPECT_NE(out.find("blocks: 3 of 8"), std::string::npos) << out;
  EXPECT_NE(out.find("blocks: 1 of 8"), std::string::npos) << out;
  std::tie(status, out) = run_cli("kv verify " + dir.path().string());
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("verified 4 blocks, 0 bad"), std::string::npos) << out;

  const auto slab = dir.path() / KVStore::directory_name(kv_namespace("model-a")) / "slab-0.dat";
  {
    std::fstream f(slab, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 + 10);  // the second block
    f.put('\x7f');
  }
  std::tie(status, out) = run_cli("kv verify " + dir.path().string());
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("slab-0.dat"), std::string::npos) << out;
  EXPECT_NE(out.find("1 bad"), std::string::npos) << out;

  std::tie(status, out) = run_cli("kv stats " + (dir.path() / "nothing").string());
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("cannot list the KV root"), std::string::npos) << out;
}

// The benchmark runs, verifies what it got back, writes its rows and cleans up; its figures are
// never checked. Bad sizes are clear errors.
TEST(KvCli, BenchRunsAndReportsEverySizeBesideRawIo) {
  TempDir dir;
  const std::string json = (dir / "rows.json").string();
  auto [status, out] = run_cli("kv bench " + (dir / "scratch").string() +
                               " --sizes 4K,64K --bytes 256K --batch 4 --pieces 3 --json " + json);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("4 KiB x     64 (   4/call) host"), std::string::npos) << out;
  EXPECT_NE(out.find("64 KiB x      4 (   4/call) host"), std::string::npos) << out;
  EXPECT_NE(out.find("raw"), std::string::npos) << out;
  EXPECT_NE(out.find("ms per pass: put"), std::string::npos) << out;
  std::ifstream rows(json);
  const std::string text((std::istreambuf_iterator<char>(rows)), {});
  EXPECT_NE(text.find("\"raw_write_gbps\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"get_warm_seconds\""), std::string::npos) << text;
  EXPECT_NE(out.find("per round, x raw: put "), std::string::npos) << out;
  EXPECT_NE(out.find(" (median "), std::string::npos) << out;  // of the rounds' ratios
  for (const auto& row : nlohmann::json::parse(text)) {  // each round's rates, one a round
    const auto rounds = row.at("rounds").get<std::size_t>();
    for (const char* key :
         {"put_round_gbps", "raw_write_round_gbps", "get_cold_round_gbps", "raw_read_round_gbps",
          "get_warm_round_gbps", "one_piece_warm_round_gbps"})
      EXPECT_EQ(row.at(key).size(), rounds) << key;
    EXPECT_GT(row.at("one_piece_warm_gbps").get<double>(), 0);  // 3 pieces: one piece beside
  }
  EXPECT_NE(out.find("warm get x one piece"), std::string::npos) << out;
  // Blocks per call from bytes per call: 64 KiB of 4 KiB blocks is 16 a call.
  std::tie(status, out) = run_cli("kv bench " + (dir / "scratch").string() +
                                  " --sizes 4K --bytes 256K --batch-bytes 64K --rounds 1");
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("4 KiB x     64 (  16/call) host"), std::string::npos) << out;
  EXPECT_EQ(out.find("warm get x one piece"), std::string::npos) << out;  // one piece already
  std::size_t left = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "scratch")) {
    (void)entry;
    ++left;
  }
  EXPECT_EQ(left, 0u);  // the stores and the raw file are removed
  std::tie(status, out) = run_cli("kv bench " + (dir / "scratch").string() + " --sizes 4Q");
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("\"4Q\" is not a size"), std::string::npos) << out;
}

// The device bounce buffer's groups (KVGpuGroups) from the command line: kept in the rows (host
// memory has no groups, so only the echo is checked here; test_gpu_kv_layouts moves blocks with
// them); out-of-range values are refused.
TEST(KvCli, BenchTakesTheGpuGroupsAndRefusesBadOnes) {
  TempDir dir;
  const std::string json = (dir / "rows.json").string();
  const std::string bench = "kv bench " + (dir / "scratch").string() + " --sizes 4K --bytes 64K " +
                            "--rounds 1 --batch 4 --pieces 2";
  auto [status, out] =
      run_cli(bench + " --group-bytes 3M --group-flights 2 --group-threads 5" + " --json " + json);
  ASSERT_EQ(status, 0) << out;
  std::ifstream rows(json);
  const auto parsed = nlohmann::json::parse(rows);
  ASSERT_EQ(parsed.size(), 1u) << parsed.dump();
  EXPECT_EQ(parsed[0]["gpu_groups"]["bytes"], 3u << 20) << parsed.dump();
  EXPECT_EQ(parsed[0]["gpu_groups"]["flights"], 2u) << parsed.dump();
  EXPECT_EQ(parsed[0]["gpu_groups"]["threads"], 5u) << parsed.dump();
  const std::pair<const char*, const char*> bad[] = {{" --group-bytes 0", "\"0\" is not a size"},
                                                     {" --group-flights 17", "--group-flights"},
                                                     {" --group-threads 0", "--group-threads"}};
  for (const auto& [flag, error] : bad) {
    std::tie(status, out) = run_cli(bench + flag);
    EXPECT_NE(status, 0) << flag << ": " << out;
    EXPECT_NE(out.find(error), std::string::npos) << flag << ": " << out;
  }
}

// `--writers 3`: three writer processes on one namespace, a reader following them; the reader
// gets every writer's blocks back bit-exact (the bench fails otherwise) and its index holds all
// of them. Figures are never checked, only that they are there.
TEST(KvCli, BenchWithAFleetOfWritersReadsBackEveryWritersBlocks) {
  TempDir dir;
  const std::string json = (dir / "fleet.json").string();
  auto [status, out] = run_cli("kv bench " + (dir / "scratch").string() +
                               " --writers 3 --sizes 64K --bytes 512K --batch 4 --rounds 2 "
                               "--pieces 3 --json " + json);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("3 writer processes on one namespace, 8 blocks of 64 KiB each, 4 per put"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("raw O_DIRECT writes of the same bytes: one writer alone"), std::string::npos)
      << out;
  EXPECT_NE(out.find("lookup of a 16-key prefix while they write"), std::string::npos) << out;
  EXPECT_NE(out.find("reader: got all 24 blocks"), std::string::npos) << out;
  std::ifstream rows(json);
  const auto row = nlohmann::json::parse(rows);
  EXPECT_EQ(row.at("writers"), 3);
  EXPECT_EQ(row.at("blocks_read"), 24);
  EXPECT_EQ(row.at("store_blocks"), 24);  // each writer's last round, the earlier ones evicted
  EXPECT_EQ(row.at("writer_put_gbps").size(), 3u);
  EXPECT_GE(row.at("lookups").get<int>(), 2);  // one at least per round
  EXPECT_GT(row.at("fleet_put_gbps").get<double>(), 0);
  EXPECT_GT(row.at("raw_one_writer_gbps").get<double>(), 0);
  EXPECT_GT(row.at("raw_fleet_gbps").get<double>(), 0);
  EXPECT_GT(row.at("raw_fleet_shared_gbps").get<double>(), 0);
  EXPECT_GE(row.at("pass_seconds_in_fleet").at("writers_active").get<int>(), 1);
  EXPECT_EQ(row.at("one_writer_round_gbps").size(), 2u);  // one a round, beside the fleet's
  EXPECT_EQ(row.at("fleet_round_gbps").size(), 2u);
  EXPECT_NE(out.find("each round's x one: "), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir / "scratch" / "fleet"));  // removed after
  std::tie(status, out) =
      run_cli("kv bench " + (dir / "scratch").string() + " --writers 0 --sizes 64K");
  EXPECT_NE(status, 0) << out;
}

// `--device A,B` puts writer w's memory on the (w mod 2)-th device (a node's engine instances
// each on a GPU of its own); a list without --writers is refused, naming the option.
TEST(KvCli, BenchFleetWritersTakeTheListedDevicesInTurn) {
  TempDir dir;
  const std::string json = (dir / "fleet.json").string();
  auto [status, out] = run_cli("kv bench " + (dir / "scratch").string() +
                               " --writers 2 --device cpu,cpu --sizes 64K --bytes 256K --batch 4 "
                               "--rounds 1 --json " +
                               json);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("cpu,cpu memory (writer w on the (w mod n)-th): 2 writer processes"),
            std::string::npos)
      << out;
  std::ifstream rows(json);
  EXPECT_EQ(nlohmann::json::parse(rows).at("memory"), "cpu,cpu");
  std::tie(status, out) =
      run_cli("kv bench " + (dir / "scratch").string() + " --device cpu,cpu --sizes 64K");
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("--device cpu,cpu: a list of devices is for a fleet's writers"),
            std::string::npos)
      << out;
  std::tie(status, out) = run_cli("kv bench " + (dir / "scratch").string() +
                                  " --writers 2 --device cpu,gpu7 --sizes 64K");
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("gpu7"), std::string::npos) << out;
}

// A namespace whose manifest.json is gone (its journal and slabs are there) is reported as
// damaged by stats and verify, which fail; before, verify said "verified 0 blocks, 0 bad" (exit
// 0) and stats "no KV stores".
TEST(KvCli, ANamespaceWithoutItsManifestIsReportedDamaged) {
  TempDir dir;
  {
    auto good = KVStore::open(dir.path(), kv_namespace("kept"), 8 * 4096, 4096);
    auto lost = KVStore::open(dir.path(), kv_namespace("lost"), 8 * 4096, 4096);
    ASSERT_TRUE(put_one(good, 1, kv_bytes(1, 4096)).ok());
    ASSERT_TRUE(put_one(lost, 2, kv_bytes(2, 4096)).ok());
  }
  const auto lost_dir = dir.path() / KVStore::directory_name(kv_namespace("lost"));
  std::filesystem::remove(lost_dir / "manifest.json");
  for (const char* command : {"kv stats ", "kv verify "}) {
    auto [status, out] = run_cli(command + dir.path().string());
    EXPECT_EQ(status, 1) << command << out;
    EXPECT_NE(out.find("DAMAGED"), std::string::npos) << command << out;
    EXPECT_NE(out.find((lost_dir / "manifest.json").string() + " is missing"), std::string::npos)
        << command << out;
  }
  // The healthy namespace is still reported and verified beside it.
  auto [status, out] = run_cli("kv verify " + dir.path().string());
  EXPECT_NE(out.find("verified 1 blocks, 0 bad, 1 namespaces DAMAGED"), std::string::npos) << out;
  std::tie(status, out) = run_cli("kv stats " + dir.path().string());
  EXPECT_NE(out.find("model=kept"), std::string::npos) << out;
}

// A FIFO (or a directory) in place of a namespace's manifest, journal or checkpoint: stats and
// verify end at once, naming the file as not a regular file, instead of hanging on the open.
TEST(KvCli, AFifoOrDirectoryInPlaceOfAStoreFileIsRefusedNotWaitedOn) {
  for (const char* name : {"manifest.json", "journal", "checkpoint", "slab-0.dat"}) {
    for (const bool fifo : {true, false}) {
      TempDir dir;
      {
        auto store = KVStore::open(dir.path(), kv_namespace(), 8 * 4096, 4096);
        ASSERT_TRUE(put_one(store, 1, kv_bytes(1, 4096)).ok());
      }  // the close checkpoints: every file exists
      const auto file = dir.path() / KVStore::directory_name(kv_namespace()) / name;
      std::filesystem::remove(file);
      if (fifo)
        ASSERT_EQ(::mkfifo(file.c_str(), 0600), 0);
      else
        std::filesystem::create_directory(file);
      for (const char* command : {"kv stats ", "kv verify "}) {
        auto [status, out] = run_cli(command + dir.path().string());
        EXPECT_EQ(status, 1) << name << " " << command << out;
        EXPECT_NE(out.find(file.string() + ": not a regular file"), std::string::npos)
            << name << (fifo ? " (FIFO) " : " (directory) ") << command << out;
      }
    }
  }
}

// Names come from the store's manifest, written by whoever made the store: stats prints them
// with control characters escaped, so a model name cannot retitle or recolour the terminal.
TEST(KvCli, StatsEscapesControlCharactersInStoredNames) {
  TempDir dir;
  const KVNamespace ns{"\x1b]0;TITLE\x07\x1b[31mRED\x1b[0m", "bf\x1b[2J16", "l=\n4", 0, 1};
  { auto store = KVStore::open(dir.path(), ns, 8 * 4096, 4096); }
  auto [status, out] = run_cli("kv stats " + dir.path().string());
  EXPECT_EQ(status, 0) << out;
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << out;
  EXPECT_EQ(out.find('\x07'), std::string::npos) << out;
  EXPECT_NE(out.find("model=\\x1b]0;TITLE\\x07\\x1b[31mRED\\x1b[0m"), std::string::npos) << out;
  EXPECT_NE(out.find("dtype=bf\\x1b[2J16 layout=l=\\n4"), std::string::npos) << out;
}

}  // namespace
}  // namespace ferry::test
