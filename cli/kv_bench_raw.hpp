// Raw I/O of the same bytes as the store moves, for `ferry kv bench` and its fleet form
// (kv_fleet_bench.hpp) to measure the store against.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "platform/file_descriptor.hpp"
#include "platform/file_ops.hpp"

namespace ferry::kv_bench {

double seconds_since(std::chrono::steady_clock::time_point start);

// `n` rounded up to 4 KiB: the slot a block of n bytes takes.
std::uint64_t round_up(std::uint64_t n);

// Raw I/O of the same bytes as the store moves: `count` blocks, one pwrite/pread per block at
// 4 KiB-aligned slots from a buffer of its own per block of a batch, in batches whose blocks run
// on as many threads as the store keeps in flight; writes are O_DIRECT with one fdatasync per
// batch (as a durable put), cold reads O_DIRECT, warm reads buffered from the page cache. The
// file is removed with the object.
class RawFile {
 public:
  RawFile(std::filesystem::path file, std::uint64_t block, std::uint64_t count,
          std::uint64_t batch);
  RawFile(const RawFile&) = delete;
  RawFile& operator=(const RawFile&) = delete;
  ~RawFile();

  // Seconds for one pass over every block; `threads` writers (0: all 16, at most the batch).
  double write(std::size_t threads = 0);
  double read_cold();
  double read_warm();

 private:
  static constexpr std::uint64_t kThreads = 16;

  detail::NativeDescriptor direct() const;
  double pass(bool writing, detail::NativeDescriptor fd, std::size_t threads = 0);

  std::filesystem::path _path;
  std::uint64_t _slot, _count, _batch;
  detail::FileDescriptor _buffered, _direct;
  std::size_t _threads = 0;
  std::shared_ptr<void> _memory;  // the batch's blocks, a slot each
};

}  // namespace ferry::kv_bench
