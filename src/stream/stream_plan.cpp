#include "ferry/stream_plan.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ferry/error.hpp"

namespace ferry {
namespace {

constexpr int kPasses = 4;  // the last is measured: the ones before fill the pipeline

// Block i (0-based) of k evenly spaced ones among `count` (k <= count), the last block always
// among them; strictly increasing in i.
std::size_t evenly_spaced_at(std::size_t count, std::size_t k, std::size_t i) {
  return static_cast<std::size_t>((static_cast<std::uint64_t>(i) + 1) * count / k - 1);
}

// k of `count` blocks, evenly spaced, the last block always among them.
std::vector<std::size_t> evenly_spaced(std::size_t count, std::size_t k) {
  std::vector<std::size_t> chosen(k);
  for (std::size_t i = 0; i < k; ++i) chosen[i] = evenly_spaced_at(count, k, i);
  return chosen;
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
  StreamPlan none = plan_stream(input, {});
  if (none.gpu_bytes <= gpu_budget_bytes) return none;
  const std::size_t p = input.prefetch;
  FERRY_EXPECT(p >= 1 && p <= n, std::invalid_argument, "stream plan: a prefetch distance of ", p,
               " for ", n, " blocks: it must be 1 to ", n, ", the blocks there are to stream");
  // The GPU bytes of streaming k evenly spaced blocks: the rest resident, plus prefetch slots of
  // the largest streamed one. O(k), without the pipeline's simulation.
  const std::uint64_t total = none.gpu_bytes - input.other_bytes;
  const auto gpu_bytes = [&](std::size_t k) {
    std::uint64_t streamed = 0, largest = 0;
    for (std::size_t i = 0; i < k; ++i) {
      const std::uint64_t b = input.block_bytes[evenly_spaced_at(n, k, i)];
      streamed += b;
      largest = std::max(largest, b);
    }
    return input.other_bytes + (total - streamed) + p * largest;
  };
  // A bound below it in O(1) (after one sort): k blocks stream at most the k largest, and the
  // largest of them is at least the k-th smallest and the last block (always streamed). Only a
  // k whose bound could fit is counted exactly: for blocks of about one size, few are; trying
  // every k (each O(n)) made a plan of 100,000 blocks take minutes.
  std::vector<std::uint64_t> ascending(input.block_bytes);
  std::sort(ascending.begin(), ascending.end());
  std::vector<std::uint64_t> largest_sum(n + 1, 0);  // of the k largest
  for (std::size_t k = 1; k <= n; ++k) largest_sum[k] = largest_sum[k - 1] + ascending[n - k];
  const auto bound = [&](std::size_t k) {
    const std::uint64_t least_largest = std::max(ascending[k - 1], input.block_bytes[n - 1]);
    return input.other_bytes + (total - largest_sum[k]) + p * least_largest;
  };
  for (std::size_t k = p; k <= n; ++k)
    if (bound(k) <= gpu_budget_bytes && gpu_bytes(k) <= gpu_budget_bytes)
      return plan_stream(input, evenly_spaced(n, k));
  // Nothing fits: the least any k needs, for the message (the first k to need it).
  std::size_t best_k = n;
  std::uint64_t best = gpu_bytes(n);
  for (std::size_t k = p; k < n; ++k) {
    if (bound(k) > best) continue;
    const std::uint64_t g = gpu_bytes(k);
    if (g < best || (g == best && k < best_k)) {
      best = g;
      best_k = k;
    }
  }
  if (none.gpu_bytes <= best) {
    best = none.gpu_bytes;
    best_k = 0;
  }
  detail::fail<std::invalid_argument>("stream plan: a GPU budget of ", gpu_budget_bytes,
                                      " bytes is less than the ", best,
                                      " bytes the weights need even with ", best_k, " of ", n,
                                      " blocks streamed (prefetch ", p, ")");
}

}  // namespace ferry
