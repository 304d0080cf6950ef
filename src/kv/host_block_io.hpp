// BlockIo for host memory: positioned I/O on the slab files, up to 16 blocks of a batch in flight
// at once (the queue depth NVMe and virtio disks want) on the transfer core's worker threads.
// Each block is ONE read or write, by the cheapest route its memory allows:
//   - a get whose slot is in the page cache (or a slab that refuses O_DIRECT): one buffered
//     preadv straight into the caller's pieces; a put on such a slab: one pwritev from them;
//   - a block of one 4 KiB-aligned piece: O_DIRECT straight between the caller's memory and
//     the slab (the last partial page, if any, through a one-page buffer); pieces all 4 KiB-
//     aligned in address and length (vLLM's per-layer pages): one O_DIRECT preadv/pwritev;
//   - anything else through a 4 KiB-aligned bounce buffer (pieces gathered, one O_DIRECT write;
//     one read, checked, then scattered). Buffers are kept between calls (up to 64 MiB).
// Checksums are XXH3-64 of the bytes where they sit: a get read into the bounce buffer is
// verified before any byte reaches the caller; one read straight into the caller's memory is
// verified there, so a mismatch (reported, the block dropped: a miss) leaves bytes undefined.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "kv/block_io.hpp"
#include "kv/slab_files.hpp"
#include "platform/system.hpp"

namespace ferry::detail::kv {

class HostBlockIo final : public BlockIo {
 public:
  HostBlockIo(SlabFiles& slabs, std::uint64_t slot_bytes) : _slabs(slabs), _slot_bytes(slot_bytes) {}
  void write(std::span<BlockRequest> batch, void* after_event) override;
  void read(std::span<BlockRequest> batch) override;
  void sync(int slab) override;
  bool direct() const override;
  void share_writes(unsigned writers) override { _writers.store(std::max(1u, writers)); }

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const noexcept { aligned_free(p); }
  };
  using Buffer = std::unique_ptr<std::byte, FreeDeleter>;
  Buffer take_buffer();
  void give_buffer(Buffer buffer);
  // Runs `one(request, bounce)` over the batch, blocks in parallel; `bounce` is a buffer taken
  // at the first block that asks for it (one(...) calls bounce() to get it).
  // `in_flight`: the most blocks moving at once.
  template <class One>
  void for_each_block(std::span<BlockRequest> batch, bool bounces, std::size_t in_flight,
                      One&& one);
  void write_one(BlockRequest& request, const std::function<std::byte*()>& bounce);
  // `cached`: the block's slot is in the page cache.
  void read_one(BlockRequest& request, bool cached, const std::function<std::byte*()>& bounce);

  SlabFiles& _slabs;
  std::uint64_t _slot_bytes;
  std::mutex _idle_mutex;
  std::vector<Buffer> _idle;  // bounce buffers kept for the next call
  std::atomic<unsigned> _writers{1};  // share_writes
};

}  // namespace ferry::detail::kv
