// Planning a weight stream before it runs: which blocks to stream (the last K of every N, or the
// fewest evenly spaced ones that fit a GPU memory budget), and what a step then costs. The cost
// comes from simulating the pipeline WeightStream runs (one copy engine filling slots in release
// order, each streamed block waiting for its fill, a fill starting when the block P streamed
// blocks earlier has run), so a setting is known to stall, and by how much, before it runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ferry {

struct StreamPlanInput {
  std::vector<std::uint64_t> block_bytes;  // each block's weights, in execution order
  std::vector<double> block_seconds;       // each block's compute per step; empty: all 0
  std::uint64_t other_bytes = 0;           // resident weights outside the blocks
  double link_bytes_per_second = 0;        // the source's rate into the GPU (pinned H2D, disk)
  unsigned prefetch = 1;
};

struct StreamPlan {
  std::vector<std::size_t> streamed;  // block indices
  std::uint64_t streamed_bytes = 0;   // copied per step
  std::uint64_t slot_bytes = 0;       // prefetch slots of the largest streamed block
  std::uint64_t gpu_bytes = 0;        // other + resident blocks + slots
  double compute_seconds = 0;         // a step with every block resident
  double copy_seconds = 0;            // streamed bytes / link: the bound of a step
  double step_seconds = 0;            // a steady step with these blocks streamed
  double stall_seconds = 0;           // step_seconds - compute_seconds
};

// The last `last` of every `group_size` consecutive blocks. Throws std::invalid_argument unless
// 1 <= last <= group_size.
std::vector<std::size_t> every_nth_blocks(std::size_t count, std::size_t group_size,
                                          std::size_t last);

// The cost of streaming `streamed` (sorted block indices). Throws std::invalid_argument for an
// index out of range, a prefetch of 0 or beyond the streamed count, or no link rate.
StreamPlan plan_stream(const StreamPlanInput& input, std::vector<std::size_t> streamed);

// The fewest evenly spaced streamed blocks whose plan needs at most `gpu_budget_bytes` (none
// when everything fits). Throws std::invalid_argument, giving the least it can fit, where even
// streaming every block does not.
StreamPlan plan_for_budget(const StreamPlanInput& input, std::uint64_t gpu_budget_bytes);

}  // namespace ferry
