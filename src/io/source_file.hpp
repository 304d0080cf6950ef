// A file read for a transfer, with its I/O path chosen and explained: O_DIRECT (bypasses the
// page cache; needs 4 KiB-aligned offsets, lengths and buffers) or buffered. The choice is made
// once, at the first read, from the file set's open file.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>

#include "ferry/file_set.hpp"
#include "ferry/io_types.hpp"
#include "platform/file_descriptor.hpp"
#include "platform/file.hpp"

namespace ferry::detail {

// How long a file's page-cache residency is trusted before it is measured again.
inline constexpr double kResidencyMaxAge = 1.0;
// Auto reads a file at least this much in the page cache through it (far faster than from the
// device), the rest with O_DIRECT where the file system allows.
inline constexpr double kBufferedFromResidency = 0.5;

// The residency probe over a descriptor (see platform/file.hpp).
double page_cache_fraction(const FileDescriptor& fd, std::uint64_t size);

class SourceFile {
 public:
  // File `index` of `files`; opened (and its path chosen) at the first open(). For writing,
  // auto means O_DIRECT where the file system allows it (the page cache is not consulted).
  SourceFile(std::shared_ptr<const FileSet> files, std::uint32_t index, IoMode mode,
             bool writing = false);
  // A file of its own, opened and its path chosen now.
  SourceFile(const std::filesystem::path& path, IoMode mode);

  // The open file to pass to read(); holding it keeps the file open.
  std::shared_ptr<const PlatformFile> open();

  // Reads [offset, offset + size) into `staging`, which is page-aligned and holds at least
  // size + 2 * kDirectAlignment bytes. Returns where the first requested byte landed: staging
  // plus the offset's distance from the page boundary below it, on either path.
  const std::byte* read(const PlatformFile& file, std::uint64_t offset, std::uint64_t size,
                        std::byte* staging);
  const std::byte* read(std::uint64_t offset, std::uint64_t size, std::byte* staging);

  // Reads [offset, offset + size) straight into host memory at `memory`, skipping staging:
  // buffered, or O_DIRECT where offset, size and memory are all 4 KiB-aligned. Returns false,
  // having read nothing, where the file reads O_DIRECT and they are not.
  bool read_into(const PlatformFile& file, std::uint64_t offset, std::uint64_t size,
                 std::byte* memory);

  // Writes `size` bytes to [offset, offset + size) from `staging` + (offset % kDirectAlignment),
  // page-aligned staging as for read(). With O_DIRECT the 4 KiB-aligned body goes unbuffered
  // and the unaligned edges buffered, so no neighbouring byte is ever rewritten.
  void write(const PlatformFile& file, std::uint64_t offset, std::uint64_t size,
             const std::byte* staging);

  // Whether open() was ever called (the file was touched).
  bool touched() const noexcept { return _touched.load(std::memory_order_relaxed); }

  // Whether reads use O_DIRECT now (after the first open()).
  bool direct() const noexcept { return _use_direct.load(std::memory_order_relaxed); }

  FileLoadStats stats() const;

 private:
  void choose(const PlatformFile& file);
  const std::byte* read_direct(const PlatformFile& file, std::uint64_t offset, std::uint64_t size,
                               std::byte* staging);
  void fall_back_to_buffered(const std::string& why);

  std::shared_ptr<const FileSet> _files;
  std::uint32_t _index;
  IoMode _mode;
  bool _writing = false;
  std::atomic<bool> _touched{false};
  std::once_flag _chosen;
  std::shared_ptr<const PlatformFile> _held;  // the own-file constructor's
  std::atomic<bool> _use_direct{false};
  std::atomic<std::uint64_t> _bytes_read{0};
  mutable std::mutex _reason_mutex;
  std::string _reason;
};

}  // namespace ferry::detail
