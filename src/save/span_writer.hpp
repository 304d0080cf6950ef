// The save path's one write loop: spans of host or GPU memory, back to back, into a file.
// Pieces of the file pass through a bounded set of staging buffers (pinned when a span lives on
// a GPU): the calling thread copies the next piece in (device -> host, or memcpy) while writer
// threads write earlier ones out, so copies and writes overlap and host memory stays at the
// staging size however large the file. Every write is a whole piece at a piece-aligned offset
// (the last one rounded up to 4 KiB and cut back by OutputFile::commit), as O_DIRECT needs.
// Meant to be replaced by a transfer-engine submission when that lands; callers only see this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "save/output_file.hpp"

namespace ferry::detail {

struct MemorySpan {
  const std::byte* data = nullptr;
  std::uint64_t size = 0;
  int cuda_device = -1;  // the GPU whose memory `data` is; -1 for host memory
};

struct SpanWriteOptions {
  std::uint64_t staging_bytes = 128ull << 20;  // all staging buffers together
  std::uint64_t piece_bytes = 16ull << 20;     // one write
  unsigned writer_threads = 4;
};

struct SpanWriteStats {
  std::uint64_t bytes = 0;          // span bytes written
  std::uint64_t staging_bytes = 0;  // staging allocated
  bool pinned = false;              // staging registered with the driver
  double fill_seconds = 0;          // copying pieces into staging
  double wait_seconds = 0;          // waiting for a free buffer (the writes were behind)
  double write_seconds = 0;         // summed over the writer threads
};

// Writes the spans at file offsets 0, size0, size0 + size1, ... Returns when all are written;
// throws (std::system_error, CudaError) after the writers stopped, leaving the file uncommitted.
SpanWriteStats write_spans(OutputFile& file, std::span<const MemorySpan> spans,
                           const SpanWriteOptions& options);

}  // namespace ferry::detail
