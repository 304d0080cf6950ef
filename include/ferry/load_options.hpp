// How to load: destination device, which tensors, and the engine's knobs (all optional: zero
// means "chosen from this machine").
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/device.hpp"

namespace ferry {

enum class IoMode {
  Auto,      // per file: buffered when mostly in page cache, else O_DIRECT where supported
  Direct,    // O_DIRECT, an error where the file system refuses it
  Buffered,  // always through the page cache
};

// "auto" | "direct" | "buffered"; throws std::invalid_argument otherwise.
IoMode parse_io_mode(std::string_view text);

inline constexpr std::uint64_t kDefaultStagingBytes = 256ull << 20;

struct LoadOptions {
  Device device = Device::cpu();
  std::vector<std::string> names;  // tensors to load; empty loads all
  IoMode io = IoMode::Auto;
  std::uint64_t staging_bytes = kDefaultStagingBytes;  // upper bound on host staging memory
  std::uint64_t chunk_bytes = 0;                       // largest read; 0 = chosen
  unsigned reader_threads = 0;                         // 0 = chosen
  // Called from reader threads, one at a time, after each chunk lands.
  std::function<void(std::uint64_t bytes_done, std::uint64_t bytes_total)> progress;
};

}  // namespace ferry
