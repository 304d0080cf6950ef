// The stream planner: block choice for a budget, and step times from its pipeline simulation in
// the three regimes (compute-bound, copy-bound, a single slot that serialises copy and compute).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/stream_plan.hpp"

namespace ferry {
namespace {

StreamPlanInput blocks(std::size_t n, std::uint64_t bytes, double seconds, unsigned prefetch) {
  StreamPlanInput in;
  in.block_bytes.assign(n, bytes);
  in.block_seconds.assign(n, seconds);
  in.link_bytes_per_second = 100;  // a block of 100 bytes copies in 1 s
  in.prefetch = prefetch;
  return in;
}

TEST(StreamPlan, OneSlotSerialisesCopyAndCompute) {
  const auto plan = plan_stream(blocks(4, 100, 2.0, 1), {0, 1, 2, 3});
  EXPECT_DOUBLE_EQ(plan.compute_seconds, 8.0);
  EXPECT_DOUBLE_EQ(plan.copy_seconds, 4.0);
  EXPECT_DOUBLE_EQ(plan.step_seconds, 12.0);  // each block: its copy, then its compute
  EXPECT_DOUBLE_EQ(plan.stall_seconds, 4.0);
  EXPECT_EQ(plan.slot_bytes, 100u);
  EXPECT_EQ(plan.gpu_bytes, 100u);
}

TEST(StreamPlan, TwoSlotsHideCopiesShorterThanCompute) {
  const auto plan = plan_stream(blocks(4, 100, 2.0, 2), {0, 1, 2, 3});
  EXPECT_DOUBLE_EQ(plan.step_seconds, 8.0);
  EXPECT_DOUBLE_EQ(plan.stall_seconds, 0.0);
  EXPECT_EQ(plan.gpu_bytes, 200u);
}

TEST(StreamPlan, CopyBoundStepsTakeTheCopyTime) {
  const auto plan = plan_stream(blocks(4, 100, 0.5, 2), {0, 1, 2, 3});
  EXPECT_DOUBLE_EQ(plan.step_seconds, plan.copy_seconds);
  EXPECT_DOUBLE_EQ(plan.stall_seconds, 2.0);
}

TEST(StreamPlan, ResidentBlocksHideCopies) {
  auto in = blocks(4, 100, 1.0, 1);
  in.other_bytes = 7;
  const auto plan = plan_stream(in, every_nth_blocks(4, 2, 1));
  EXPECT_EQ(plan.streamed, (std::vector<std::size_t>{1, 3}));
  EXPECT_EQ(plan.gpu_bytes, 7u + 2 * 100 + 100);
  // Block 3's fill (1 s) overlaps blocks 0-1's compute, then block 1's fill overlaps 2-3's.
  EXPECT_DOUBLE_EQ(plan.step_seconds, 4.0);
  const auto none = plan_stream(in, {});
  EXPECT_DOUBLE_EQ(none.step_seconds, 4.0);
  EXPECT_EQ(none.gpu_bytes, 407u);
}

TEST(StreamPlan, BudgetPicksTheFewestEvenlySpacedBlocks) {
  auto in = blocks(8, 100, 1.0, 1);
  in.other_bytes = 50;
  EXPECT_TRUE(plan_for_budget(in, 850).streamed.empty());
  const auto plan = plan_for_budget(in, 600);  // 50 + (8 - k) * 100 + 100 <= 600: k = 4
  EXPECT_EQ(plan.streamed, (std::vector<std::size_t>{1, 3, 5, 7}));
  EXPECT_LE(plan.gpu_bytes, 600u);
  try {
    plan_for_budget(in, 100);
    ADD_FAILURE() << "an impossible budget was met";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("150 bytes"), std::string::npos) << e.what();
  }
}

// What plan_for_budget must give, found the plain way: every k, each plan simulated.
struct Reference {
  std::size_t k = 0;        // the fewest streamed that fit; SIZE_MAX: none fits
  std::uint64_t least = 0;  // the least GPU bytes any k needs
};
Reference by_every_k(const StreamPlanInput& in, std::uint64_t budget) {
  const std::size_t n = in.block_bytes.size();
  Reference r{SIZE_MAX, UINT64_MAX};
  for (std::size_t k = 0; k <= n; ++k) {
    if (k > 0 && k < in.prefetch) continue;
    std::vector<std::size_t> chosen;
    for (std::size_t i = 0; i < k; ++i) chosen.push_back((i + 1) * n / k - 1);
    const std::uint64_t gpu = plan_stream(in, chosen).gpu_bytes;
    if (gpu <= budget && r.k == SIZE_MAX) r.k = k;
    r.least = std::min(r.least, gpu);
  }
  return r;
}

// Blocks of uneven sizes (a few small dense ones, many larger, some odd): the budget search
// picks what trying every k picks, and an impossible budget names the least any k needs.
TEST(StreamPlan, BudgetSearchAgreesWithTryingEveryK) {
  std::uint64_t state = 12345;
  const auto next = [&] { return state = state * 6364136223846793005ull + 1442695040888963407ull; };
  for (unsigned prefetch : {1u, 2u, 3u}) {
    for (std::size_t n : {1u, 2u, 7u, 40u, 97u}) {
      StreamPlanInput in = blocks(n, 0, 0.0, prefetch);
      if (prefetch > n) continue;
      for (std::size_t i = 0; i < n; ++i)
        in.block_bytes[i] =
            i < 3 ? 10 + next() % 20 : 100 + (next() >> 33) % (i % 5 == 0 ? 400 : 5);
      in.other_bytes = 7;
      std::uint64_t all = in.other_bytes;
      for (auto b : in.block_bytes) all += b;
      for (std::uint64_t budget = 0; budget <= all; budget += 1 + all / 97) {
        SCOPED_TRACE("n " + std::to_string(n) + " prefetch " + std::to_string(prefetch) +
                     " budget " + std::to_string(budget));
        const Reference want = by_every_k(in, budget);
        if (want.k == SIZE_MAX) {
          try {
            plan_for_budget(in, budget);
            ADD_FAILURE() << "an impossible budget was met";
          } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find(" " + std::to_string(want.least) + " bytes"),
                      std::string::npos)
                << e.what();
          }
          continue;
        }
        const StreamPlan got = plan_for_budget(in, budget);
        EXPECT_EQ(got.streamed.size(), want.k);
        EXPECT_LE(got.gpu_bytes, budget);
      }
    }
  }
}

// 200,000 blocks (a plan of 100,000 took minutes when every k was simulated): the right blocks,
// evenly spaced, and the least bytes named when nothing fits. The test's timeout catches a
// search that is quadratic again.
TEST(StreamPlan, BudgetSearchOverManyBlocks) {
  constexpr std::size_t n = 200000;
  auto in = blocks(n, 1, 0.0, 2);
  in.other_bytes = 1000;
  // 1000 + (n - k) + 2 <= 1000 + n / 2 + 2: k = n / 2, every second block.
  const StreamPlan half = plan_for_budget(in, 1000 + n / 2 + 2);
  ASSERT_EQ(half.streamed.size(), n / 2);
  for (std::size_t i = 0; i < half.streamed.size(); ++i) ASSERT_EQ(half.streamed[i], 2 * i + 1);
  try {
    plan_for_budget(in, 0);
    ADD_FAILURE() << "an impossible budget was met";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("1002 bytes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("200000 of 200000 blocks"), std::string::npos) << e.what();
  }
}

// A prefetch distance beyond the block count is named as such, not as a budget too small.
TEST(StreamPlan, PrefetchBeyondTheBlocksIsNamed) {
  auto in = blocks(8, 100, 1.0, 9);
  try {
    plan_for_budget(in, 500);
    ADD_FAILURE() << "a prefetch of 9 for 8 blocks was planned";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("prefetch distance of 9 for 8 blocks"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(plan_for_budget(in, 800).streamed.empty());  // fits without streaming: no slots
}

TEST(StreamPlan, BadSettingsAreRefused) {
  EXPECT_THROW(plan_stream(blocks(4, 100, 1, 0), {0, 1}), std::invalid_argument);
  EXPECT_THROW(plan_stream(blocks(4, 100, 1, 3), {0, 1}), std::invalid_argument);
  EXPECT_THROW(plan_stream(blocks(4, 100, 1, 1), {4}), std::invalid_argument);
  auto in = blocks(4, 100, 1, 1);
  in.link_bytes_per_second = 0;
  EXPECT_THROW(plan_stream(in, {1}), std::invalid_argument);
  in.block_seconds = {1.0};
  EXPECT_THROW(plan_stream(in, {}), std::invalid_argument);
  EXPECT_THROW(every_nth_blocks(4, 2, 3), std::invalid_argument);
  EXPECT_THROW(every_nth_blocks(4, 0, 0), std::invalid_argument);
}

}  // namespace
}  // namespace ferry
