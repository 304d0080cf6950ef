#include "transfer/staged_plan.hpp"

#include <algorithm>

#include "platform/file.hpp"

namespace ferry::detail {

StagedPlan plan_staged(const std::vector<Extent>& extents, std::uint64_t chunk) {
  StagedPlan plan;
  plan.pieces_per_extent.assign(extents.size(), 0);
  plan.pieces.reserve(extents.size());
  plan.groups.reserve(extents.size());
  for (std::uint32_t e = 0; e < extents.size(); ++e) {
    const Extent& x = extents[e];
    std::uint64_t total = 0;
    for (const auto& s : x.spans) total += s.size;
    for (std::uint64_t at = 0; at < total;) {
      const std::uint64_t file_at = x.file_offset + at;
      std::uint64_t end = std::min(total, at + chunk);
      if (end < total) {
        const std::uint64_t aligned = (file_at + chunk) / kDirectAlignment * kDirectAlignment;
        if (aligned > file_at) end = aligned - x.file_offset;
      }
      const std::uint64_t size = end - at;
      const auto index = static_cast<std::uint32_t>(plan.pieces.size());
      plan.pieces.push_back({e, at, size});
      ++plan.pieces_per_extent[e];
      Group* last = plan.groups.empty() ? nullptr : &plan.groups.back();
      if (last && last->file == x.file && last->file_offset + last->size == file_at &&
          last->size + size <= chunk) {
        last->size += size;
        ++last->count;
      } else {
        plan.groups.push_back({x.file, file_at, size, index, 1});
      }
      plan.largest_group = std::max(plan.largest_group, plan.groups.back().size);
      at = end;
    }
  }
  return plan;
}

}  // namespace ferry::detail
