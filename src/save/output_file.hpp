// A file being written: created under a temporary name in the destination's directory and
// renamed over the final name only after every byte is written and synced, so a crash or an
// error never leaves a half-written file under the final name. O_DIRECT where the file system
// allows it (writes then need 4 KiB-aligned offsets, sizes and buffers), else buffered, and
// the reason is kept for the statistics.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>

#include "io/file_descriptor.hpp"

namespace ferry::detail {

inline constexpr std::size_t kWriteAlignment = 4096;

class OutputFile {
 public:
  // Creates the temporary file beside `path`; throws std::system_error naming `path` when the
  // directory cannot be written. `direct` asks for O_DIRECT.
  OutputFile(std::filesystem::path path, bool direct);
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();  // removes the temporary file unless committed

  // Writes `size` bytes at `offset`. With direct(), all three must be aligned to
  // kWriteAlignment. A file system that refuses an O_DIRECT write switches the file to
  // buffered (and says so); other errors throw std::system_error naming the final path.
  // Safe to call from several threads at once for disjoint ranges.
  void write_at(std::uint64_t offset, const void* data, std::size_t size);

  // Cuts the file to `size`, syncs it, renames it to the final name and syncs the directory.
  void commit(std::uint64_t size);

  bool direct() const noexcept { return _direct; }
  std::string io_reason() const;
  const std::filesystem::path& path() const noexcept { return _path; }

 private:
  std::filesystem::path _path;
  std::filesystem::path _temporary;
  FileDescriptor _fd;
  std::atomic<bool> _direct = false;
  mutable std::mutex _reason_mutex;
  bool _committed = false;
  std::string _reason;
};

}  // namespace ferry::detail
