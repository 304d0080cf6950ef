// The POSIX implementation of platform/file.hpp.
#include "platform/file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "ferry/error.hpp"

namespace ferry::detail {
namespace {

int fd_of(NativeFile f) { return static_cast<int>(f); }

// EMFILE and ENFILE name the process's (or the system's) descriptor limit, not the file.
[[noreturn]] void open_failed(int error, const std::filesystem::path& path) {
  if (error == EMFILE || error == ENFILE)
    fail_errno(error, path.string(), ": too many open files (",
               error == EMFILE ? "this process's limit, ulimit -n" : "the system's limit",
               ", is reached)");
  fail_errno(error, path.string());
}

FileIdentity identity_of(const struct stat& st) {
  return {static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
          static_cast<std::uint64_t>(st.st_size),
          static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
          static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec};
}

}  // namespace

void close_native_file(NativeFile f) noexcept { ::close(fd_of(f)); }

PlatformFile PlatformFile::open(const std::filesystem::path& path, FileAccess access,
                                bool want_direct) {
  PlatformFile f;
  f._path = path;
  f._access = access;
  const bool writable = access == FileAccess::ReadWrite;
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it changes nothing for files.
  const int flags = (writable ? O_RDWR | O_CREAT : O_RDONLY) | O_CLOEXEC | O_NONBLOCK;
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) open_failed(errno, path);
  f._buffered = fd;
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_errno(errno, path.string());
  FERRY_EXPECT(S_ISREG(st.st_mode), std::invalid_argument, path.string(), ": not a regular file");
  // Reads must block normally from here on.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  f._identity = identity_of(st);
  if (want_direct) f.add_direct();
  return f;
}

FileIdentity PlatformFile::current_identity() const {
  struct stat st {};
  if (::fstat(fd_of(_buffered), &st) != 0) fail_errno(errno, _path.string());
  return identity_of(st);
}

bool PlatformFile::add_direct() {
  if (has_direct()) return true;
  if (!_direct_refusal.empty()) return false;  // refused once: the file system will again
  const int flags = (_access == FileAccess::ReadWrite ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_DIRECT;
  // Through /proc, the open descriptor's own file: a path renamed over or deleted since the
  // first open still reaches the file ferry opened.
  const std::string self = "/proc/self/fd/" + std::to_string(fd_of(_buffered));
  int fd = ::open(self.c_str(), flags);
  if (fd < 0 && errno == ENOENT) fd = ::open(_path.c_str(), flags);  // no /proc mounted
  if (fd < 0) {
    const int error = errno;
    if (error == EMFILE || error == ENFILE) open_failed(error, _path);
    _direct_refusal = std::strerror(error);
    return false;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !identity_of(st).same_file(_identity)) {
    ::close(fd);
    fail_errno(ESTALE, _path.string(),
               ": the file changed underneath ferry (replaced or removed "
               "since it was opened)");
  }
  _direct.store(fd, std::memory_order_release);
  return true;
}

std::size_t PlatformFile::read_up_to(void* buffer, std::size_t size, std::uint64_t offset,
                                     bool direct) const {
  const int fd = fd_of(native(direct));
  auto* out = static_cast<char*>(buffer);
  std::size_t done = 0;
  while (done < size) {
    const std::size_t want =
        direct ? std::min<std::size_t>(size - done, kMaxDirectCall) : size - done;
    const ssize_t n = ::pread(fd, out + done, want, static_cast<off_t>(offset + done));
    if (n < 0) {
      const int error = errno;
      if (error == EINTR) continue;
      fail_errno(error, _path.string(), ": read of ", size, " bytes at offset ", offset, " failed");
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

void PlatformFile::write_all(const void* buffer, std::size_t size, std::uint64_t offset,
                             bool direct) const {
  const int fd = fd_of(native(direct));
  const auto* in = static_cast<const char*>(buffer);
  std::size_t done = 0;
  while (done < size) {
    const std::size_t want =
        direct ? std::min<std::size_t>(size - done, kMaxDirectCall) : size - done;
    const ssize_t n = ::pwrite(fd, in + done, want, static_cast<off_t>(offset + done));
    if (n < 0) {
      const int error = errno;
      if (error == EINTR) continue;
      fail_errno(error, _path.string(), ": write of ", size, " bytes at offset ", offset,
                 " failed");
    }
    if (n == 0)
      fail_errno(ENOSPC, _path.string(), ": write of ", size, " bytes at offset ", offset,
                 " stopped after ", done);
    done += static_cast<std::size_t>(n);
  }
}

void PlatformFile::sync() const {
  if (::fdatasync(fd_of(_buffered)) != 0) fail_errno(errno, _path.string(), ": fdatasync");
}

bool page_cache_residency_measured() noexcept { return true; }

double page_cache_fraction(NativeFile file, std::uint64_t size) {
  if (size == 0) return 1.0;
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd_of(file), 0);
  if (map == MAP_FAILED) return 0.0;
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t pages = (size + page - 1) / page;
  constexpr std::uint64_t kWindowPages = 16;
  const std::uint64_t windows =
      pages <= kResidencySamplePages ? 1 : kResidencySamplePages / kWindowPages;
  const std::uint64_t window_pages = windows == 1 ? pages : kWindowPages;
  std::vector<unsigned char> resident(window_pages);
  std::uint64_t asked = 0;
  std::uint64_t in_cache = 0;
  for (std::uint64_t w = 0; w < windows; ++w) {
    // Window w starts w/windows of the way into the file; the last one ends at its end.
    const std::uint64_t first = std::min(pages - window_pages, pages * w / windows);
    const std::uint64_t length = std::min(window_pages * page, size - first * page);
    if (::mincore(static_cast<char*>(map) + first * page, length, resident.data()) != 0) break;
    const std::uint64_t n = (length + page - 1) / page;
    for (std::uint64_t i = 0; i < n; ++i) in_cache += resident[i] & 1;
    asked += n;
  }
  ::munmap(map, size);
  return asked ? static_cast<double>(in_cache) / static_cast<double>(asked) : 0.0;
}

double PlatformFile::residency(double max_age_seconds) const {
  const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now().time_since_epoch())
                               .count();
  const std::int64_t at = _residency_at.load(std::memory_order_acquire);
  if (at >= 0 && static_cast<double>(now - at) < max_age_seconds * 1e9)
    return _residency.load(std::memory_order_relaxed);
  // Two threads may both measure: harmless, the later result stays.
  const double fraction = page_cache_fraction(_buffered, _identity.size);
  _residency.store(fraction, std::memory_order_relaxed);
  _residency_at.store(now, std::memory_order_release);
  return fraction;
}

std::optional<FileIdentity> identity_at(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return identity_of(st);
}

std::uint64_t open_file_limit() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 0;
  return static_cast<std::uint64_t>(limit.rlim_cur);
}

}  // namespace ferry::detail
