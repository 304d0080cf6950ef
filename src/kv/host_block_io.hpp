// BlockIo for host memory: positioned I/O on the slab files through 4 KiB-aligned bounce buffers
// (O_DIRECT needs aligned memory, lengths and offsets; the caller's pieces are neither). The
// pieces of a block are gathered into a buffer and written with one pwrite. Small blocks of a
// batch go several at once (up to 16 MiB in flight, four threads, a buffer each); a large block's
// one I/O already fills the device queue. Buffers are kept between calls (up to 64 MiB), so
// their pages are not faulted in again for every batch.
#pragma once

#include <cstdlib>
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

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const noexcept { aligned_free(p); }
  };
  using Buffer = std::unique_ptr<std::byte, FreeDeleter>;
  Buffer take_buffer();
  void give_buffer(Buffer buffer);
  // Runs `one(request, bounce buffer)` over the batch on the threads this block size allows.
  template <class One>
  void for_each_block(std::span<BlockRequest> batch, One&& one);

  SlabFiles& _slabs;
  std::uint64_t _slot_bytes;
  std::mutex _idle_mutex;
  std::vector<Buffer> _idle;  // bounce buffers kept for the next call
};

}  // namespace ferry::detail::kv
