// A checkpoint file opened for the engine, with its I/O path chosen and explained: O_DIRECT
// (bypasses the page cache; needs 4 KiB-aligned offsets, lengths and buffers) or buffered.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>

#include "ferry/load_options.hpp"
#include "ferry/load_stats.hpp"
#include "io/file_descriptor.hpp"

namespace ferry::detail {

inline constexpr std::uint64_t kDirectAlignment = 4096;

// Fraction of the file's pages resident in the page cache (mincore over a mapping). Large files
// are sampled: at most `kResidencySamplePages` pages in evenly spaced windows, since asking for
// every page costs about 35 ms per 4 GB (a third of a warm 16 GB load, measured on an H200 host).
inline constexpr std::uint64_t kResidencySamplePages = 16384;
double page_cache_fraction(const FileDescriptor& fd, std::uint64_t size);

class SourceFile {
 public:
  SourceFile(const std::filesystem::path& path, IoMode mode);

  // Reads [offset, offset + size) into `staging`, which is page-aligned and holds at least
  // size + 2 * kDirectAlignment bytes. Returns where the first requested byte landed: staging
  // plus the offset's distance from the page boundary below it, on either path.
  const std::byte* read(std::uint64_t offset, std::uint64_t size, std::byte* staging);

  FileLoadStats stats() const;

 private:
  const std::byte* read_direct(std::uint64_t offset, std::uint64_t size, std::byte* staging);
  void fall_back_to_buffered(const std::string& why);

  std::filesystem::path _path;
  FileDescriptor _buffered;
  FileDescriptor _direct;
  std::uint64_t _size = 0;
  std::atomic<bool> _use_direct{false};
  std::atomic<std::uint64_t> _bytes_read{0};
  mutable std::mutex _reason_mutex;
  std::string _reason;
};

}  // namespace ferry::detail
