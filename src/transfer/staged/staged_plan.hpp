// How the staged path cuts a submission into work: each extent into pieces of at most one chunk
// (split on page boundaries, so O_DIRECT stays aligned), and runs of pieces that follow each
// other in one file into groups of at most one chunk, so that many small extents share one
// staging slot and one read or write. A group is the unit a worker takes; a piece is the unit
// of per-extent status.
#pragma once

#include <cstdint>
#include <vector>

#include "ferry/transfer.hpp"

namespace ferry::detail {

// `size` bytes at `extent_offset` of extent `extent`.
struct Piece {
  std::uint32_t extent = 0;
  std::uint64_t extent_offset = 0;
  std::uint64_t size = 0;
};

// Pieces [first, first + count) of the plan, back to back in `file` from `file_offset`.
struct Group {
  std::uint32_t file = 0;
  std::uint64_t file_offset = 0;
  std::uint64_t size = 0;
  std::uint32_t first = 0;
  std::uint32_t count = 0;
};

struct StagedPlan {
  std::vector<Piece> pieces;
  std::vector<Group> groups;
  std::vector<std::uint32_t> pieces_per_extent;
  std::uint64_t largest_group = 0;
};

// Pieces of at most `chunk` bytes (a multiple of the page size), grouped in submission order:
// a piece joins the group before it when it starts where that group ends in the same file and
// the group stays within `chunk`. The first and last `edge_bytes` of the submission are cut in
// `edge_chunk` pieces instead: the copies start sooner after the first reads (the workers'
// first wave), and the workers run out of work closer together at the end.
// `round_robin`: the extents' pieces are cut and ordered in rounds (the first piece of every
// extent, then the second of those with bytes left, ...) instead of extent by extent; each
// extent's pieces stay in order, so observing an extent in order never waits on a later group.
StagedPlan plan_staged(const std::vector<Extent>& extents, std::uint64_t chunk,
                       std::uint64_t edge_bytes = 0, std::uint64_t edge_chunk = 0,
                       bool round_robin = false);

// The bytes of extent `x` under piece `p`: fn(span, offset in span, offset in piece, bytes).
template <class Fn>
void for_spans(const Extent& x, const Piece& p, Fn&& fn) {
  std::uint64_t span_start = 0;
  const std::uint64_t end = p.extent_offset + p.size;
  for (const MemorySpan& s : x.spans) {
    const std::uint64_t span_end = span_start + s.size;
    if (span_end > p.extent_offset && span_start < end) {
      const std::uint64_t from = std::max(span_start, p.extent_offset);
      const std::uint64_t to = std::min(span_end, end);
      fn(s, from - span_start, from - p.extent_offset, to - from);
    }
    if (span_end >= end) break;
    span_start = span_end;
  }
}

}  // namespace ferry::detail
