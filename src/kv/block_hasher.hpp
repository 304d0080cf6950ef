// XXH3-64 of a block's bytes wherever they live, the same digest the host path takes: host
// pieces are hashed in place, GPU pieces are copied down in chunks through two pinned buffers
// per device (the copy of one chunk overlapping the hash of the one before). Used where a
// block's bytes never pass through host memory the store can see (the transfer core's staging,
// cuFile): over the PCIe link, not the disk, so it costs little beside the storage I/O.
// Not thread-safe: one caller at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>

#include "kv/block_io.hpp"
#include "kv/checksum.hpp"

namespace ferry::detail::kv {

class BlockHasher {
 public:
  BlockHasher();
  ~BlockHasher();
  BlockHasher(const BlockHasher&) = delete;
  BlockHasher& operator=(const BlockHasher&) = delete;

  // The pieces in order as one byte string. GPU copies wait for `after_event` (a CUevent) first.
  std::uint64_t hash(std::span<const BlockSpan> pieces, void* after_event = nullptr);

 private:
  struct DeviceState;
  DeviceState& device(int ordinal);
  std::map<int, std::unique_ptr<DeviceState>> _devices;
};

}  // namespace ferry::detail::kv
