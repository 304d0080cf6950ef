// The reference for sharded loads: a rank's slice cut on the host from the whole tensor's bytes
// (as torch's narrow(dim, begin, end - begin).contiguous() would), independent of the planner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ferry/shard_plan.hpp"

namespace ferry::test {

inline std::vector<std::byte> host_slice(const std::vector<std::byte>& whole, const ShardPiece& p) {
  if (p.replicated()) return whole;
  const auto& shape = p.info->shape;
  std::uint64_t outer = 1;
  for (int d = 0; d < p.dim; ++d) outer *= shape[d];
  const std::uint64_t length = shape[p.dim];
  const std::uint64_t steps = outer * length;
  const std::uint64_t unit = steps > 0 ? whole.size() / steps : 0;
  std::vector<std::byte> out;
  for (std::uint64_t o = 0; o < outer; ++o)
    out.insert(out.end(), whole.begin() + (o * length + p.begin) * unit,
               whole.begin() + (o * length + p.end) * unit);
  return out;
}

}  // namespace ferry::test
