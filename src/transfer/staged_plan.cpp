#include "transfer/staged_plan.hpp"

#include <algorithm>

#include "platform/file.hpp"

namespace ferry::detail {

namespace {

std::uint64_t extent_bytes(const Extent& x) {
  std::uint64_t n = 0;
  for (const auto& s : x.spans) n += s.size;
  return n;
}

}  // namespace

StagedPlan plan_staged(const std::vector<Extent>& extents, std::uint64_t chunk,
                       std::uint64_t edge_bytes, std::uint64_t edge_chunk) {
  StagedPlan plan;
  plan.pieces_per_extent.assign(extents.size(), 0);
  plan.pieces.reserve(extents.size());
  plan.groups.reserve(extents.size());
  std::uint64_t submission = 0;
  if (edge_bytes > 0 && edge_chunk > 0 && edge_chunk < chunk)
    for (const Extent& x : extents) submission += extent_bytes(x);
  // Where the edges are worth it: a submission of many waves of chunks.
  if (submission < 4 * edge_bytes) edge_bytes = 0;
  // The largest piece or group starting `position` bytes into the submission.
  const auto limit_at = [&](std::uint64_t position) {
    const bool edge = position < edge_bytes || position + edge_bytes >= submission;
    return edge_bytes && edge ? edge_chunk : chunk;
  };
  std::uint64_t before = 0;          // submission bytes before this extent
  std::uint64_t group_position = 0;  // where the last group starts in the submission
  for (std::uint32_t e = 0; e < extents.size(); ++e) {
    const Extent& x = extents[e];
    const std::uint64_t total = extent_bytes(x);
    for (std::uint64_t at = 0; at < total;) {
      const std::uint64_t limit = limit_at(before + at);
      const std::uint64_t file_at = x.file_offset + at;
      std::uint64_t end = std::min(total, at + limit);
      if (end < total) {
        const std::uint64_t aligned = (file_at + limit) / kDirectAlignment * kDirectAlignment;
        if (aligned > file_at) end = aligned - x.file_offset;
      }
      const std::uint64_t size = end - at;
      const auto index = static_cast<std::uint32_t>(plan.pieces.size());
      plan.pieces.push_back({e, at, size});
      ++plan.pieces_per_extent[e];
      Group* last = plan.groups.empty() ? nullptr : &plan.groups.back();
      if (last && last->file == x.file && last->file_offset + last->size == file_at &&
          last->size + size <= limit_at(group_position)) {
        last->size += size;
        ++last->count;
      } else {
        plan.groups.push_back({x.file, file_at, size, index, 1});
        group_position = before + at;
      }
      plan.largest_group = std::max(plan.largest_group, plan.groups.back().size);
      at = end;
    }
    before += total;
  }
  return plan;
}

}  // namespace ferry::detail
