#include "ferry/stream_plan.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "ferry/error.hpp"

namespace ferry {
namespace {

constexpr int kPasses = 4;  // the last is measured: the ones before fill the pipeline

// k of `count` blocks, evenly spaced, the last block always among them.
std::vector<std::size_t> evenly_spaced(std::size_t count, std::size_t k) {
  std::set<std::size_t> chosen;
  for (std::size_t i = 0; i < k; ++i) chosen.insert((i + 1) * count / k - 1);
  return {chosen.begin(), chosen.end()};
}

}  // namespace

std::vector<std::size_t> every_nth_blocks(std::size_t count, std::size_t group_size,
                                          std::size_t last) {
  FERRY_EXPECT(group_size >= 1 && last >= 1 && last <= group_size, std::invalid_argument,
               "stream plan: the last ", last, " of every ", group_size,
               " blocks: need 1 <= last <= group size");
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < count; ++i)
    if (i % group_size >= group_size - last) out.push_back(i);
  return out;
}

StreamPlan plan_stream(const StreamPlanInput& input, std::vector<std::size_t> streamed) {
  const std::size_t n = input.block_bytes.size();
  FERRY_EXPECT(input.block_seconds.empty() || input.block_seconds.size() == n,
               std::invalid_argument, "stream plan: ", input.block_seconds.size(),
               " compute times for ", n, " blocks");
  std::sort(streamed.begin(), streamed.end());
  streamed.erase(std::unique(streamed.begin(), streamed.end()), streamed.end());
  FERRY_EXPECT(streamed.empty() || streamed.back() < n, std::invalid_argument,
               "stream plan: block ", streamed.empty() ? 0 : streamed.back(), " of ", n);
  const auto seconds = [&](std::size_t i) {
    return input.block_seconds.empty() ? 0.0 : input.block_seconds[i];
  };
  StreamPlan plan;
  plan.streamed = streamed;
  plan.gpu_bytes = input.other_bytes;
  std::vector<long> rank(n, -1);
  std::uint64_t largest = 0;
  for (std::size_t r = 0; r < streamed.size(); ++r) {
    rank[streamed[r]] = static_cast<long>(r);
    plan.streamed_bytes += input.block_bytes[streamed[r]];
    largest = std::max(largest, input.block_bytes[streamed[r]]);
  }
  for (std::size_t i = 0; i < n; ++i) {
    plan.compute_seconds += seconds(i);
    if (rank[i] < 0) plan.gpu_bytes += input.block_bytes[i];
  }
  const std::size_t m = streamed.size();
  if (m == 0) {
    plan.step_seconds = plan.compute_seconds;
    return plan;
  }
  FERRY_EXPECT(input.prefetch >= 1 && input.prefetch <= m, std::invalid_argument,
               "stream plan: a prefetch distance of ", input.prefetch, " for ", m,
               " streamed blocks (1 to ", m, ")");
  FERRY_EXPECT(input.link_bytes_per_second > 0 && std::isfinite(input.link_bytes_per_second),
               std::invalid_argument, "stream plan: no link rate to copy at");
  const std::size_t slots = input.prefetch;
  plan.slot_bytes = slots * largest;
  plan.gpu_bytes += plan.slot_bytes;
  plan.copy_seconds = static_cast<double>(plan.streamed_bytes) / input.link_bytes_per_second;

  // The copy engine runs fills one after another, in the order they are issued.
  double copy_free = 0;
  std::vector<double> ready(m, 0);
  auto fill = [&](std::size_t r, double issued) {
    const double start = std::max(copy_free, issued);
    copy_free =
        start + static_cast<double>(input.block_bytes[streamed[r]]) / input.link_bytes_per_second;
    ready[r] = copy_free;
  };
  for (std::size_t r = 0; r < slots; ++r) fill(r, 0);
  double now = 0, pass_start = 0;
  for (int pass = 0; pass < kPasses; ++pass) {
    pass_start = now;
    for (std::size_t i = 0; i < n; ++i) {
      if (rank[i] >= 0) now = std::max(now, ready[static_cast<std::size_t>(rank[i])]);
      now += seconds(i);
      if (rank[i] >= 0 && slots < m) fill((static_cast<std::size_t>(rank[i]) + slots) % m, now);
    }
  }
  plan.step_seconds = now - pass_start;
  plan.stall_seconds = std::max(0.0, plan.step_seconds - plan.compute_seconds);
  return plan;
}

StreamPlan plan_for_budget(const StreamPlanInput& input, std::uint64_t gpu_budget_bytes) {
  const std::size_t n = input.block_bytes.size();
  StreamPlan best;
  for (std::size_t k = 0; k <= n; ++k) {
    if (k > 0 && k < input.prefetch) continue;
    StreamPlan plan = plan_stream(input, k == 0 ? std::vector<std::size_t>{} : evenly_spaced(n, k));
    if (plan.gpu_bytes <= gpu_budget_bytes) return plan;
    if (k == 0 || plan.gpu_bytes < best.gpu_bytes) best = std::move(plan);
  }
  detail::fail<std::invalid_argument>(
      "stream plan: a GPU budget of ", gpu_budget_bytes, " bytes is less than the ", best.gpu_bytes,
      " bytes the weights need even with ", best.streamed.size(), " of ", n,
      " blocks streamed (prefetch ", input.prefetch, ")");
}

}  // namespace ferry
