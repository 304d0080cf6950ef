// The staged data path: reader threads fill page-aligned staging slots from the files, and each
// filled slot is copied to its destinations (cuMemcpyAsync on the reader's own stream for a GPU,
// memcpy for host memory) while the next read proceeds. A slot is reused only after the event
// recorded behind its copies has completed.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ferry/checkpoint.hpp"
#include "ferry/load_options.hpp"
#include "ferry/load_stats.hpp"

namespace ferry::detail {

class PrimaryContext;

// `size` bytes at `chunk_offset` of the chunk go to address `destination`.
struct CopyTask {
  std::uint64_t chunk_offset = 0;
  std::uintptr_t destination = 0;
  std::uint64_t size = 0;
};

struct EngineChunk {
  std::uint32_t file_index = 0;
  std::uint64_t file_offset = 0;
  std::uint64_t size = 0;
  std::vector<CopyTask> copies;
};

struct EngineSettings {
  unsigned threads = 1;
  std::uint64_t chunk_bytes = 0;
  unsigned slots_per_thread = 2;
  IoMode io = IoMode::Auto;
  std::string source;  // where threads, chunk size and slots came from, in words
  const PrimaryContext* gpu = nullptr;  // null: destinations are host memory
  std::function<void(std::uint64_t, std::uint64_t)> progress;
};

// Picks threads, read size and slots per thread: the request's, else this machine's tuning file
// (ferry/tuning.hpp), else the built-in defaults; all within options.staging_bytes.
EngineSettings choose_settings(const LoadOptions& options);

// Runs every chunk; on return every byte has landed (or an exception says why not). Fills the
// I/O fields of `stats`.
void run_staged(std::span<const CheckpointFile> files, std::span<const EngineChunk> chunks,
                EngineSettings settings, LoadStats& stats);

}  // namespace ferry::detail
