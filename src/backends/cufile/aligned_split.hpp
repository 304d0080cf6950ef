// How a read (or write) of file bytes [offset, offset + size) is split for cuFile: a body whose
// file offset and length are 4 KiB multiples goes straight to GPU memory in pieces of at most
// `max_piece` bytes; the unaligned head and tail (each under 4 KiB) go through host staging.
#pragma once

#include <cstdint>
#include <vector>

namespace ferry::detail {

struct SplitPiece {
  std::uint64_t file_offset = 0;
  std::uint64_t buffer_offset = 0;  // from the start of the destination (or source) range
  std::uint64_t size = 0;
  bool direct = false;  // true: aligned body piece for cuFile; false: staged edge
};

std::vector<SplitPiece> split_aligned(std::uint64_t offset, std::uint64_t size,
                                      std::uint64_t max_piece, std::uint64_t alignment = 4096);

}  // namespace ferry::detail
