// How one file range becomes DirectStorage requests: at most kMaxRequestBytes each (larger
// requests gain nothing and tie up the queue; 16 MiB requests already reach full speed while
// 64 KiB ones crawl, so pieces stay large), laid end to end in a destination buffer. Pure logic,
// built and tested on every system.
#pragma once

#include <cstdint>
#include <vector>

namespace ferry::dstorage {

inline constexpr std::uint32_t kMaxRequestBytes = 32u << 20;

struct RequestRange {
  std::uint64_t file_offset = 0;
  std::uint32_t size = 0;
  std::uint64_t destination_offset = 0;
};

// Requests covering [file_offset, file_offset + size) in order, none larger than `max_request`
// (> 0), the first landing at `destination_offset`.
std::vector<RequestRange> split_requests(std::uint64_t file_offset, std::uint64_t size,
                                         std::uint64_t destination_offset,
                                         std::uint32_t max_request = kMaxRequestBytes);

}  // namespace ferry::dstorage
