#include "platform/file_descriptor.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "ferry/error.hpp"

namespace ferry::detail {

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    if (_fd >= 0) ::close(_fd);
    _fd = std::exchange(other._fd, -1);
  }
  return *this;
}

FileDescriptor::~FileDescriptor() {
  if (_fd >= 0) ::close(_fd);
}

FileDescriptor open_for_reading(const std::filesystem::path& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it changes nothing for files.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) FERRY_SYSCALL_FAIL(path.string());
  return FileDescriptor(fd);
}

FileDescriptor try_open_direct(const std::filesystem::path& path) {
  return FileDescriptor(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT));
}

FileDescriptor create_for_writing(const std::filesystem::path& path) {
  FileDescriptor fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) FERRY_SYSCALL_FAIL(path.string(), ": cannot create");
  return fd;
}

void write_exact(const FileDescriptor& fd, const void* buffer, std::size_t size,
                 std::uint64_t offset, const std::filesystem::path& path) {
  const auto* in = static_cast<const char*>(buffer);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd.get(), in + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      FERRY_SYSCALL_FAIL(path.string(), ": write failed");
    }
    if (n == 0) fail_errno(ENOSPC, path.string(), ": write made no progress");
    done += static_cast<std::size_t>(n);
  }
}

std::uint64_t file_size(const FileDescriptor& fd, const std::filesystem::path& path) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) FERRY_SYSCALL_FAIL(path.string());
  FERRY_EXPECT(S_ISREG(st.st_mode), std::invalid_argument, path.string(), ": not a regular file");
  return static_cast<std::uint64_t>(st.st_size);
}

std::size_t read_up_to(const FileDescriptor& fd, void* buffer, std::size_t size,
                       std::uint64_t offset, const std::filesystem::path& path) {
  auto* out = static_cast<char*>(buffer);
  std::size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd.get(), out + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      FERRY_SYSCALL_FAIL(path.string(), ": read of ", size, " bytes at offset ", offset, " failed");
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

}  // namespace ferry::detail
