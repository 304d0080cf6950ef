// The stream planner: block choice for a budget, and step times from its pipeline simulation in
// the three regimes (compute-bound, copy-bound, a single slot that serialises copy and compute).
#include <gtest/gtest.h>

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
