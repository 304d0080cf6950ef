// How to load: destination device, which tensors, and the engine's knobs (all optional: zero
// means "chosen from this machine").
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/device.hpp"
#include "ferry/io_types.hpp"

namespace ferry {

struct LoadOptions {
  Device device = Device::cpu();
  std::vector<std::string> names;  // tensors to load; empty loads all
  IoMode io = IoMode::Auto;        // for the staged path
  Backend backend = Backend::Auto;
  // Let Backend::Cufile run in cuFile's compatibility mode; let Backend::DirectStorage fall
  // back to the staged path where DirectStorage cannot run (reported per file, never silent).
  bool allow_compat = false;
  std::uint64_t staging_bytes = kDefaultStagingBytes;  // upper bound on host staging memory
  std::uint64_t chunk_bytes = 0;                       // largest read; 0 = chosen
  unsigned reader_threads = 0;                         // 0 = chosen
  unsigned slots_per_thread = 0;  // staging slots each reader cycles through; 0 = chosen (2)
  unsigned copy_streams = 0;      // CUDA streams the readers' copies share; 0 = one per reader
  // Time the copies on the GPU for the statistics (LoadStats::pipeline.copy_busy); costs a
  // little, for diagnosis.
  bool profile = false;
  // Page-cache DMA (see TransferOptions::page_cache_pin_bytes): the most bytes of files kept
  // registered for copies straight from the page cache to the GPU; 0: off.
  std::uint64_t page_cache_pin_bytes = 0;
  // load() onto a GPU (not load_into or load_fanout): take the load's memory from a process-wide per-device cache (a
  // stream-ordered memory pool) that keeps what loads free for later loads, rather than from and
  // back to the driver, whose work after a large free slows the next load's copies (~8%). Off by
  // default: the cache keeps freed memory from every other allocator (PyTorch's too) until
  // release_cached_device_memory() (loaded_checkpoint.hpp).
  bool cache_device_memory = false;
  // Called from reader threads, one at a time, after each chunk lands.
  std::function<void(std::uint64_t bytes_done, std::uint64_t bytes_total)> progress;
  // Called by the waiting thread about every 50 ms; returning false stops the load (workers stop
  // before their next chunk, everything is released) and it throws ferry::Cancelled. For
  // interrupts: Ctrl-C in the CLI, KeyboardInterrupt in Python.
  std::function<bool()> keep_going;
};

// The one mapping from a setting's name and text to LoadOptions, so that the CLI's flags, the C
// ABI and Python's keywords offer the same settings with the same checks. Keys: device, io,
// backend, allow_compat (true/false/1/0), staging_bytes, chunk_bytes (an integer of bytes, or a
// number with a unit: "1.5MiB", "4GiB"), threads, slots, copy_streams, profile (true/false),
// page_cache_pin (bytes, as chunk_bytes; 0: off), cache_device_memory (true/false). Throws
// std::invalid_argument naming the key and the value for an unknown key, a malformed value or one
// out of range.
void set_load_option(LoadOptions& options, std::string_view key, std::string_view value);

// The keys set_load_option takes, in the order above.
std::span<const std::string_view> load_option_keys();

// Upper bounds set_load_option enforces: far above any useful setting, low enough that a typo
// cannot make ferry spin up billions of threads or ask for exabytes of staging.
inline constexpr unsigned kMaxReaderThreads = 256;
inline constexpr unsigned kMaxSlotsPerThread = 64;
inline constexpr std::uint64_t kMaxChunkBytes = 1ull << 30;
inline constexpr std::uint64_t kMaxStagingBytes = 1ull << 40;
inline constexpr std::uint64_t kMaxPageCachePinBytes = 1ull << 50;

}  // namespace ferry
