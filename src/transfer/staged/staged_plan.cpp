#include "transfer/staged/staged_plan.hpp"

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
                       std::uint64_t edge_bytes, std::uint64_t edge_chunk, bool round_robin) {
  StagedPlan plan;
  plan.pieces_per_extent.assign(extents.size(), 0);
  plan.pieces.reserve(extents.size());
  plan.groups.reserve(extents.size());
  std::vector<std::uint64_t> sizes(extents.size()), cut(extents.size(), 0);
  std::uint64_t submission = 0;
  for (std::size_t e = 0; e < extents.size(); ++e)
    submission += sizes[e] = extent_bytes(extents[e]);
  // Where the edges are worth it: a submission of many waves of chunks.
  if (edge_chunk == 0 || edge_chunk >= chunk || submission < 4 * edge_bytes) edge_bytes = 0;
  // The largest piece or group starting `position` bytes into the submission.
  const auto limit_at = [&](std::uint64_t position) {
    const bool edge = position < edge_bytes || position + edge_bytes >= submission;
    return edge_bytes && edge ? edge_chunk : chunk;
  };
  std::uint64_t position = 0;        // submission bytes cut so far, in the plan's order
  std::uint64_t group_position = 0;  // where the last group starts in that order
  // The next piece of extent `e`.
  const auto cut_piece = [&](std::uint32_t e) {
    const Extent& x = extents[e];
    const std::uint64_t at = cut[e], total = sizes[e];
    const std::uint64_t limit = limit_at(position);
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
      group_position = position;
    }
    plan.largest_group = std::max(plan.largest_group, plan.groups.back().size);
    cut[e] = end;
    position += size;
  };
  if (!round_robin) {
    for (std::uint32_t e = 0; e < extents.size(); ++e)
      while (cut[e] < sizes[e]) cut_piece(e);
    return plan;
  }
  // Rounds: the next piece of every extent with bytes left, in extent order.
  std::vector<std::uint32_t> open;
  for (std::uint32_t e = 0; e < extents.size(); ++e)
    if (sizes[e] > 0) open.push_back(e);
  while (!open.empty()) {
    std::size_t kept = 0;
    for (const std::uint32_t e : open) {
      cut_piece(e);
      if (cut[e] < sizes[e]) open[kept++] = e;
    }
    open.resize(kept);
  }
  return plan;
}

}  // namespace ferry::detail
