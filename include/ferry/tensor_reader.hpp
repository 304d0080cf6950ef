// Per-key reads, for safe_open's get_tensor and get_slice. Two ways:
//  - read / read_ranges: one tensor's bytes (or byte ranges of them) read straight into host
//    memory the caller owns. No plan, no staging, no threads: the cost of a call is one
//    positioned read per range, so taking small keys one by one runs at the speed of the medium.
//  - submit / wait: a range read through the transfer core into host or cuda:N memory (staged
//    through pinned slots by the worker pool, chunks read in parallel and copies overlapped), so
//    that a large tensor or a GPU destination moves at the engine's speed, and reads ahead of
//    the caller can be in flight while it works.
// Every file of the checkpoint is opened once, when the reader is made, and held until it is
// destroyed (submissions use the checkpoint's file set, held the same way): a path replaced or
// deleted afterwards does not change what it reads. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "ferry/checkpoint.hpp"
#include "ferry/device.hpp"
#include "ferry/transfer.hpp"

namespace ferry {

class TensorReader {
 public:
  // Opens every file of `checkpoint`; throws std::system_error naming a file that cannot be
  // opened and FormatError where one no longer has the size its header was read at.
  explicit TensorReader(std::shared_ptr<const Checkpoint> checkpoint);
  TensorReader(TensorReader&&) noexcept;
  TensorReader& operator=(TensorReader&&) noexcept;
  ~TensorReader();

  const Checkpoint& checkpoint() const noexcept { return *_checkpoint; }

  // Reads bytes [begin, begin + length) of the tensor's data into `host`. Throws
  // std::out_of_range where the range leaves the tensor and FormatError naming the file where
  // the file ends early (it was truncated after opening).
  void read(const TensorInfo& tensor, std::uint64_t begin, std::uint64_t length, void* host) const;

  // A byte range [begin, end) of a tensor's data.
  struct Range {
    std::uint64_t begin = 0;
    std::uint64_t end = 0;
  };
  // Reads the ranges (in the order given) packed back to back into `host`: a strided slice (a
  // column block of a matrix) reads only its bytes. Ranges that touch are read as one.
  // Errors as read().
  void read_ranges(const TensorInfo& tensor, std::span<const Range> ranges, void* host) const;

  // Starts reading bytes [begin, begin + length) of the tensor's data into `length` bytes of
  // memory at `to` on `device` through the transfer core, and returns at once. The memory must
  // stay valid until wait() returns or the ticket is destroyed (its destructor waits). With
  // `after_event` (a CUevent) the memory is written only after that event fires (memory a
  // caching allocator hands back may still be read by kernels queued before). Throws
  // std::out_of_range as read().
  Ticket submit(const TensorInfo& tensor, std::uint64_t begin, std::uint64_t length, void* to,
                const Device& device, void* after_event = nullptr) const;
  // submit() for byte ranges (in the order given), packed back to back at `to`: one extent per
  // range (ranges that touch are one), so a column block reads only its bytes, in parallel.
  Ticket submit_ranges(const TensorInfo& tensor, std::span<const Range> ranges, void* to,
                       const Device& device, void* after_event = nullptr) const;
  // A whole tensor and the memory it goes to (its `size` bytes at `to`).
  struct Whole {
    const TensorInfo* tensor = nullptr;
    void* to = nullptr;
  };
  // submit() for many whole tensors at once: ONE ticket with one extent per tensor, so that a
  // read-ahead window of small tensors costs one submission (the engine reads them in parallel
  // and lands each in its own memory). Throws std::invalid_argument for a null tensor or memory.
  Ticket submit_tensors(std::span<const Whole> tensors, const Device& device,
                        void* after_event = nullptr) const;
  // Waits for a ticket from submit() and throws its failure (FormatError naming the file where
  // it was truncated after opening); counts its bytes in bytes_read().
  void wait(const Ticket& ticket) const;

  // Whether submissions read `tensor`'s file through the page cache (it was mostly resident
  // when first asked, or its file system refuses O_DIRECT) rather than with O_DIRECT: a small
  // read from it costs a memory copy, so per-key readers need no parallel engine job for it.
  bool through_page_cache(const TensorInfo& tensor) const;

  // File bytes read so far by this reader (read, read_ranges and waited submissions; O_DIRECT
  // alignment included): what a slice or a read-ahead really cost.
  std::uint64_t bytes_read() const noexcept;

 private:
  struct Files;
  IoMode io_mode(std::uint32_t file) const;

  std::shared_ptr<const Checkpoint> _checkpoint;
  std::unique_ptr<Files> _files;
};

}  // namespace ferry
