// What transfer_block_io.cpp and transfer_block_bounce.cpp share: a group of a GPU batch's
// blocks as one submission sees it, and the device a block goes to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "cuda/device_copies.hpp"
#include "kv/transfer_block_io.hpp"

namespace ferry::detail::kv {

// Where each block of a group sits on the device side of its transfer: its own pieces, or a run of
// its device's bounce buffer (`bounce`, 0: none) that its pieces are gathered into (a put) or
// scattered from once verified (a get).
struct TransferBlockIo::Group {
  std::span<BlockRequest* const> blocks;
  bool writing = false, direct = false;
  bool buffered = false;   // a get through the page cache (reads_buffered: probed once a batch)
  std::size_t flight = 0;  // which part of the bounce buffers (0 .. kFlights - 1)
  unsigned threads = 0;    // the core's workers for its submission
  std::vector<std::uintptr_t> bounce;
  std::vector<std::vector<BlockSpan>> views;
  // A staged get's scatters, per device: each bounced block's copies out of its run, launched
  // by the worker that queued its copies in once its checksum matched (`scattered`), the rest
  // after the group.
  std::map<int, DeviceCopyParts> parts;
  std::vector<char> scattered;
};

// The first GPU the block touches, or -1 for a block wholly in host memory.
inline int gpu_of(const BlockRequest& r) {
  for (const BlockSpan& p : r.pieces)
    if (p.device.is_cuda()) return p.device.index;
  return -1;
}

}  // namespace ferry::detail::kv
