#include "backends/cufile/aligned_split.hpp"

#include <algorithm>

namespace ferry::detail {

std::vector<SplitPiece> split_aligned(std::uint64_t offset, std::uint64_t size,
                                      std::uint64_t max_piece, std::uint64_t alignment) {
  std::vector<SplitPiece> out;
  const std::uint64_t end = offset + size;
  const std::uint64_t head_end = std::min(end, (offset + alignment - 1) / alignment * alignment);
  const std::uint64_t body_end = std::max(head_end, end / alignment * alignment);
  if (head_end > offset) out.push_back({offset, 0, head_end - offset, false});
  // Pieces are multiples of the alignment so that every direct piece starts aligned.
  const std::uint64_t piece = std::max(alignment, max_piece / alignment * alignment);
  for (std::uint64_t p = head_end; p < body_end; p += piece)
    out.push_back({p, p - offset, std::min(piece, body_end - p), true});
  if (end > body_end) out.push_back({body_end, body_end - offset, end - body_end, false});
  return out;
}

}  // namespace ferry::detail
