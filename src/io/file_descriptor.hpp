// An owned POSIX file descriptor and the few blocking reads ferry needs on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <utility>

namespace ferry::detail {

class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) noexcept : _fd(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  FileDescriptor(FileDescriptor&& other) noexcept : _fd(std::exchange(other._fd, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  ~FileDescriptor();

  int get() const noexcept { return _fd; }
  explicit operator bool() const noexcept { return _fd >= 0; }

 private:
  int _fd = -1;
};

// Opens for reading; throws std::system_error naming the path.
FileDescriptor open_for_reading(const std::filesystem::path& path);

// Opens with O_DIRECT, or returns an empty descriptor with errno set where the file system
// refuses it (EINVAL on tmpfs and others).
FileDescriptor try_open_direct(const std::filesystem::path& path);

std::uint64_t file_size(const FileDescriptor& fd, const std::filesystem::path& path);

// Reads exactly `size` bytes at `offset`, retrying short reads; a read that hits the end of
// the file first is an error naming the path (the file shrank or lied about its size).
void read_exact(const FileDescriptor& fd, void* buffer, std::size_t size, std::uint64_t offset,
                const std::filesystem::path& path);

// Reads up to `size` bytes at `offset`, stopping early only at the end of the file. Returns the
// bytes read. Throws on errors other than EINTR.
std::size_t read_up_to(const FileDescriptor& fd, void* buffer, std::size_t size,
                       std::uint64_t offset, const std::filesystem::path& path);

}  // namespace ferry::detail
