#include "backends/dstorage/request_split.hpp"

#include <algorithm>
#include <stdexcept>

#include "ferry/error.hpp"

namespace ferry::dstorage {

std::vector<RequestRange> split_requests(std::uint64_t file_offset, std::uint64_t size,
                                         std::uint64_t destination_offset,
                                         std::uint32_t max_request) {
  FERRY_EXPECT(max_request > 0, std::invalid_argument, "DirectStorage requests of 0 bytes");
  std::vector<RequestRange> out;
  out.reserve(static_cast<std::size_t>((size + max_request - 1) / max_request));
  for (std::uint64_t done = 0; done < size;) {
    const auto piece =
        static_cast<std::uint32_t>(std::min<std::uint64_t>(max_request, size - done));
    out.push_back({file_offset + done, piece, destination_offset + done});
    done += piece;
  }
  return out;
}

}  // namespace ferry::dstorage
