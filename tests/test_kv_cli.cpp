// `ferry kv stats`, `verify` and `bench` on stores made here (the CLI as a user runs it).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>

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
  // Blocks per call from bytes per call: 64 KiB of 4 KiB blocks is 16 a call.
  std::tie(status, out) = run_cli("kv bench " + (dir / "scratch").string() +
                                  " --sizes 4K --bytes 256K --batch-bytes 64K --rounds 1");
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("4 KiB x     64 (  16/call) host"), std::string::npos) << out;
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

}  // namespace
}  // namespace ferry::test
