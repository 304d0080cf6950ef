// The host's image of copy_matched.cu's MatchedCopy and its launch shape, shared by every caller
// of ferry_copy_matched (the GPU checksum's matched scatter, device_copies' gather/scatter).
#pragma once

#include <cstdint>

namespace ferry::detail {

constexpr unsigned kMatchedCopyThreads = 256;                // ferry_copy_matched's, per slice
constexpr std::uint64_t kMatchedCopySliceBytes = 64 * 1024;  // copy_matched.cu's

struct MatchedCopyJob {  // copy_matched.cu's MatchedCopy, byte for byte
  std::uint64_t from;
  std::uint64_t to;
  std::uint64_t size;
  std::uint64_t block;
  std::uint64_t first_slice;
};

}  // namespace ferry::detail
