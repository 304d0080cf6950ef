// BlockIo for host memory: positioned I/O on the slab files through 4 KiB-aligned bounce buffers
// (O_DIRECT needs aligned memory, lengths and offsets; the caller's pieces are neither). The
// pieces of a block are gathered into a buffer and written with one pwrite; up to four blocks of
// a batch are in flight at once, each on its own thread and buffer.
#pragma once

#include "kv/block_io.hpp"
#include "kv/slab_files.hpp"

namespace ferry::detail::kv {

class HostBlockIo final : public BlockIo {
 public:
  HostBlockIo(SlabFiles& slabs, std::uint64_t slot_bytes) : _slabs(slabs), _slot_bytes(slot_bytes) {}
  void write(std::span<BlockRequest> batch, void* after_event) override;
  void read(std::span<BlockRequest> batch) override;
  void sync(int slab) override;
  bool direct() const override;

 private:
  SlabFiles& _slabs;
  std::uint64_t _slot_bytes;
};

}  // namespace ferry::detail::kv
