// The POSIX implementation of platform/file_ops.hpp: the system calls themselves.
#include "platform/file_ops.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

namespace ferry::detail {
namespace {

// O_NONBLOCK: opening a FIFO must not wait for a writer (callers refuse what is not a regular
// file); it is cleared at once, as it changes nothing for files.
FileDescriptor open_without_waiting(const std::filesystem::path& path, int flags,
                                    unsigned mode = 0) noexcept {
  FileDescriptor fd(::open(path.c_str(), flags | O_NONBLOCK, mode));
  if (fd) ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace

FileDescriptor open_existing(const std::filesystem::path& path, bool writable,
                             bool direct) noexcept {
  const int flags = (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | (direct ? O_DIRECT : 0);
  return open_without_waiting(path, flags);
}

FileDescriptor open_or_create(const std::filesystem::path& path, unsigned mode) noexcept {
  return open_without_waiting(path, O_RDWR | O_CREAT | O_CLOEXEC, mode);
}

FileDescriptor create_new(const std::filesystem::path& path, unsigned mode) noexcept {
  return FileDescriptor(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
}

std::optional<FileIdentity> identity_of_open(NativeDescriptor fd) noexcept {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::nullopt;
  return FileIdentity{
      static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
      static_cast<std::uint64_t>(st.st_size),
      static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
      static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec};
}

std::int64_t file_clock_now_ns() noexcept {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<std::int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

std::int64_t read_some_at(NativeDescriptor fd, void* buffer, std::size_t size,
                          std::uint64_t offset) noexcept {
  return ::pread(fd, buffer, size, static_cast<off_t>(offset));
}

std::int64_t write_some_at(NativeDescriptor fd, const void* buffer, std::size_t size,
                           std::uint64_t offset) noexcept {
  return ::pwrite(fd, buffer, size, static_cast<off_t>(offset));
}

bool set_file_size(NativeDescriptor fd, std::uint64_t size) noexcept {
  return ::ftruncate(fd, static_cast<off_t>(size)) == 0;
}

int preallocate(NativeDescriptor fd, std::uint64_t size) noexcept {
  return ::posix_fallocate(fd, 0, static_cast<off_t>(size));
}

bool sync_data(NativeDescriptor fd) noexcept { return ::fdatasync(fd) == 0; }
bool sync_all(NativeDescriptor fd) noexcept { return ::fsync(fd) == 0; }
bool lock_exclusive(NativeDescriptor fd) noexcept { return ::flock(fd, LOCK_EX | LOCK_NB) == 0; }

bool rename_replacing(const std::filesystem::path& from, const std::filesystem::path& to) noexcept {
  return ::rename(from.c_str(), to.c_str()) == 0;
}

bool remove_file(const std::filesystem::path& path) noexcept { return ::unlink(path.c_str()) == 0; }

bool create_directory(const std::filesystem::path& path, unsigned mode) noexcept {
  return ::mkdir(path.c_str(), mode) == 0;
}

bool sync_directory(const std::filesystem::path& directory) noexcept {
  FileDescriptor fd(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  return fd && ::fsync(fd.get()) == 0;
}

}  // namespace ferry::detail
