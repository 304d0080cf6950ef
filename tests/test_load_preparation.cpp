// LoadPreparation and warm_up: a first load's set-up made ahead, then used by the load.
#include <gtest/gtest.h>

#include <cstring>

#include "ferry/error.hpp"
#include "ferry/load_preparation.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "services/pinned_pool.hpp"
#include "services/worker_pool.hpp"
#include "staging_limit.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

using test::TempDir;

LoadOptions four_readers() {
  LoadOptions o;
  o.reader_threads = 4;
  o.chunk_bytes = 1 << 20;
  return o;
}

TEST(LoadPreparation, MakesTheStagingAndThreadsTheLoadThenUses) {
  test::StagingLimit limit(1ull << 30);  // idle staging freed: this test's slabs alone
  const WarmUpReport report = LoadPreparation(four_readers()).wait();
  EXPECT_EQ(report.slabs, 4u);  // one per reader
  EXPECT_FALSE(report.pinned);  // host memory: nothing to pin
  EXPECT_EQ(report.streams, 0u);
  EXPECT_GE(report.threads, 4u);
  EXPECT_GT(report.staging_bytes, 4u * 2u * (1u << 20));  // two slots of a chunk and its edges
  const auto held = detail::staging_pool().stats().held_bytes;
  EXPECT_EQ(held, report.staging_bytes);

  TempDir dir;
  const auto written = test::write_random_checkpoint(
      dir / "m.safetensors", {{"a", DType::U8, {5 << 20}}, {"b", DType::F32, {300000}}}, 31);
  auto ckpt = std::make_shared<const Checkpoint>(Checkpoint::open(dir / "m.safetensors"));
  const LoadedCheckpoint loaded = load(ckpt, four_readers());
  for (const auto& [name, bytes] : written)
    EXPECT_EQ(std::memcmp(loaded.find(name)->data, bytes.data(), bytes.size()), 0) << name;
  // The load leased the prepared slabs: nothing new allocated.
  EXPECT_EQ(detail::staging_pool().stats().held_bytes, held);
  EXPECT_EQ(detail::staging_pool().stats().high_water, held);
}

TEST(LoadPreparation, StopsAtTheProcesssStagingBound) {
  const std::uint64_t slab = 2 * ((1ull << 20) + 3 * 4096);  // two slots: chunk and edges
  test::StagingLimit limit(2 * slab + slab / 2);
  const WarmUpReport report = LoadPreparation(four_readers()).wait();
  EXPECT_EQ(report.slabs, 2u);
  EXPECT_LE(detail::staging_pool().stats().held_bytes, 2 * slab + slab / 2);
}

TEST(LoadPreparation, SettingsThatCannotRunAreRefusedAtOnce) {
  LoadOptions tiny = four_readers();
  tiny.staging_bytes = 4096;  // not one slot of a 1 MiB read
  try {
    LoadPreparation p(tiny);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot hold"), std::string::npos) << e.what();
  }
  EXPECT_THROW(LoadPreparation().wait(), std::logic_error);
  EXPECT_FALSE(LoadPreparation().started());
}

TEST(LoadPreparation, AGpuWithoutADriverIsAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is usable here: test_gpu covers this";
  LoadOptions o = four_readers();
  o.device = Device::cuda(0);
  LoadPreparation p(o);  // the failure comes from the preparing thread, through wait()
  EXPECT_TRUE(p.started());
  try {
    p.wait();
    FAIL() << "no error";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("warm-up for cuda:0"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(p.done());
}

}  // namespace
}  // namespace ferry
