// The save path's write: spans of host or GPU memory, back to back, into a file, as one
// memory -> file submission to the transfer core (its pipelined staged path: each worker copies
// the next piece into a pinned slot while it writes the one before). Host memory stays within
// the staging bound however large the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "save/output_file.hpp"

namespace ferry::detail {

struct MemorySpan {
  const std::byte* data = nullptr;
  std::uint64_t size = 0;
  int cuda_device = -1;  // the GPU whose memory `data` is; -1 for host memory
};

struct SpanWriteOptions {
  bool direct = true;                          // O_DIRECT where the file system allows it
  std::uint64_t staging_bytes = 128ull << 20;  // all staging together (at least one piece)
  std::uint64_t piece_bytes = 16ull << 20;     // one write
  unsigned writer_threads = 4;                 // at most; fewer where staging is short
};

struct SpanWriteStats {
  std::uint64_t bytes = 0;          // span bytes written
  std::uint64_t staging_bytes = 0;  // staging leased
  bool pinned = false;              // staging registered with the driver
  bool direct = false;              // written with O_DIRECT
  std::string io_reason;            // why that path
  double fill_seconds = 0;          // copying pieces into staging, summed over the workers
  double wait_seconds = 0;          // waiting for those copies
  double write_seconds = 0;         // writing, summed over the workers
};

// Writes the spans at file offsets 0, size0, size0 + size1, ... after the work already queued
// on each of their GPUs' default streams. Returns when all are written; throws
// (std::system_error naming the file's final path, CudaError), leaving the file uncommitted.
SpanWriteStats write_spans(OutputFile& file, std::span<const MemorySpan> spans,
                           const SpanWriteOptions& options);

}  // namespace ferry::detail
