// An open file as the operating system gives it: one buffered handle, and an unbuffered one
// (O_DIRECT; FILE_FLAG_NO_BUFFERING on Windows) where the file system allows it, with the file's
// identity taken at open. This header is the seam: platform/posix/ and platform/windows/ implement
// what differs, platform/file.cpp what does not. Nothing above platform/ calls the OS for files.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "ferry/file_set.hpp"

namespace ferry::detail {

// Unbuffered transfers need offsets, lengths and buffers aligned to this.
inline constexpr std::uint64_t kDirectAlignment = 4096;

// The most one unbuffered read or write moves. Memory in huge pages (ferry's staging, a caller's
// large tensors) lets a whole chunk leave as one request, and the virtio disks ferry is measured
// on serve large requests slower (2026-12-05, 16 threads, 2 MiB blocks from huge pages: CPU
// machine reads 2.01-2.07 GB/s in one 2 MiB call, 2.23-2.32 in two of 1 MiB; writes 2.05-2.95
// and 2.99-3.02; the H100 machine's cold loads 2.04-2.22 in 4 MiB reads, 2.14-2.40 in 1 MiB).
// NVMe splits requests at its own transfer size anyway: there the cap costs a few system calls.
inline constexpr std::uint64_t kMaxDirectCall = 1ull << 20;

// What the file was at open. A path replaced by an atomic rename, or deleted and written again,
// names a different file: its device or inode differs.
struct FileIdentity {
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;
  // The status change time (0 on Windows): a rewrite within the modification time's granularity
  // that truncates and refills the file still moves it.
  std::int64_t ctime_ns = 0;
  // The same file: for files opened for writing only device and inode count (they grow).
  bool same_file(const FileIdentity& other) const noexcept {
    return device == other.device && inode == other.inode;
  }
  bool same_contents(const FileIdentity& other) const noexcept {
    return same_file(other) && size == other.size && mtime_ns == other.mtime_ns;
  }
  // Every field equal: what a registration of the file's pages (page-cache DMA) is kept for.
  bool same_version(const FileIdentity& other) const noexcept {
    return same_contents(other) && ctime_ns == other.ctime_ns;
  }
};

// A descriptor on POSIX, a HANDLE on Windows.
using NativeFile = std::intptr_t;
inline constexpr NativeFile kNoNativeFile = -1;
// Closes one open handle (close; CloseHandle on Windows). PlatformFile's ownership of its
// handles (platform/file.cpp) is the same everywhere; only this differs.
void close_native_file(NativeFile f) noexcept;

class PlatformFile {
 public:
  // Opens `path`. With `want_direct`, also an unbuffered handle where the file system allows it;
  // otherwise direct_refusal() says why not. Throws std::system_error naming the path (EMFILE
  // as "too many open files", never blamed on the file system), std::invalid_argument for
  // something that is not a regular file.
  static PlatformFile open(const std::filesystem::path& path, FileAccess access, bool want_direct);

  PlatformFile() = default;
  PlatformFile(const PlatformFile&) = delete;
  PlatformFile& operator=(const PlatformFile&) = delete;
  PlatformFile(PlatformFile&& other) noexcept;
  PlatformFile& operator=(PlatformFile&& other) noexcept;
  ~PlatformFile();

  const std::filesystem::path& path() const noexcept { return _path; }
  FileAccess access() const noexcept { return _access; }
  const FileIdentity& identity() const noexcept { return _identity; }
  // The file as it is now (its size may have changed since open).
  FileIdentity current_identity() const;

  bool has_direct() const noexcept {
    return _direct.load(std::memory_order_acquire) != kNoNativeFile;
  }
  const std::string& direct_refusal() const noexcept { return _direct_refusal; }
  // Opens the unbuffered handle on the very file already open (not whatever the path names
  // now); returns false (direct_refusal() says why) where the file system refuses it. Callers
  // serialise add_direct (the file set's lock); reads may run beside it.
  bool add_direct();

  // Reads up to `size` bytes at `offset`, retrying short reads and EINTR; fewer only at the end
  // of the file. `direct` uses the unbuffered handle (aligned offset, size and buffer), in calls
  // of at most kMaxDirectCall bytes.
  std::size_t read_up_to(void* buffer, std::size_t size, std::uint64_t offset, bool direct) const;
  // Writes all `size` bytes at `offset` (unbuffered: as read_up_to); a short write that makes no
  // progress is ENOSPC.
  void write_all(const void* buffer, std::size_t size, std::uint64_t offset, bool direct) const;
  // Makes written data durable (fdatasync).
  void sync() const;

  NativeFile native(bool direct) const noexcept {
    return direct ? _direct.load(std::memory_order_acquire) : _buffered;
  }

  // page_cache_fraction() of this file, measured again only once the last measurement is older
  // than `max_age_seconds`: residency drifts slowly, and measuring a large file costs up to a
  // millisecond, far more than a small transfer. A file closed and reopened measures afresh.
  double residency(double max_age_seconds) const;

 private:
  std::filesystem::path _path;
  FileAccess _access = FileAccess::Read;
  NativeFile _buffered = kNoNativeFile;
  std::atomic<NativeFile> _direct{kNoNativeFile};
  FileIdentity _identity;
  std::string _direct_refusal;
  // The last residency measurement and when it was taken (steady clock, ns; -1: never).
  mutable std::atomic<double> _residency{0};
  mutable std::atomic<std::int64_t> _residency_at{-1};
};

// Fraction of the file's pages resident in the page cache, sampled (at most
// kResidencySamplePages pages in evenly spaced windows: asking for every page cost about 35 ms
// per 4 GB, a third of a warm 16 GB load on an H200 host). 0 where it cannot be measured.
inline constexpr std::uint64_t kResidencySamplePages = 16384;
double page_cache_fraction(NativeFile file, std::uint64_t size);
// Whether page_cache_fraction measures (Linux: mincore) or cannot tell and answers 0 (Windows).
bool page_cache_residency_measured() noexcept;

// The identity of the regular file `path` names now (stat; on Windows its handle's information),
// or nullopt where there is none or it is not a regular file.
std::optional<FileIdentity> identity_at(const std::filesystem::path& path);

// The most descriptors this process may hold (RLIMIT_NOFILE), or 0 for no limit.
std::uint64_t open_file_limit();

}  // namespace ferry::detail
