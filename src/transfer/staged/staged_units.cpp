#include "transfer/staged/staged_units.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>

namespace ferry::detail {

std::vector<std::size_t> observed_units(const StagedPlan& plan, unsigned workers) {
  std::vector<std::size_t> starts;
  std::vector<std::uint64_t> bytes;
  for (std::size_t g = 0; g < plan.groups.size(); ++g) {
    const Group& group = plan.groups[g];
    // A group whose first piece starts its extent starts a unit; else it continues the extent
    // (and so the unit) of the group before it.
    if (starts.empty() || plan.pieces[group.first].extent_offset == 0) {
      starts.push_back(g);
      bytes.push_back(0);
    }
    bytes.back() += group.size;
  }
  if (starts.empty() || workers == 0) return {};
  std::uint64_t total = 0;
  for (std::uint64_t b : bytes) total += b;
  // Each unit goes to the worker free first; the last one free ends the run.
  std::priority_queue<std::uint64_t, std::vector<std::uint64_t>, std::greater<>> free_at;
  for (unsigned w = 0; w < std::min<std::size_t>(workers, bytes.size()); ++w) free_at.push(0);
  std::uint64_t end = 0;
  for (std::uint64_t b : bytes) {
    const std::uint64_t done = free_at.top() + b;
    free_at.pop();
    free_at.push(done);
    end = std::max(end, done);
  }
  const std::uint64_t share = (total + workers - 1) / workers;
  if (end * 4 > share * 5) return {};
  starts.push_back(plan.groups.size());
  return starts;
}

}  // namespace ferry::detail
