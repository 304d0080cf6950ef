// An owned file (a POSIX descriptor; a HANDLE on Windows) and the few blocking reads ferry needs
// on it, for headers and small files. platform/<os>/file_descriptor.cpp implements it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <utility>

namespace ferry::detail {

class FileDescriptor {
 public:
#ifdef _WIN32
  using Native = std::intptr_t;  // a HANDLE; INVALID_HANDLE_VALUE is -1
#else
  using Native = int;
#endif
  static constexpr Native kNone = -1;

  FileDescriptor() = default;
  explicit FileDescriptor(Native fd) noexcept : _fd(fd < 0 ? kNone : fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  FileDescriptor(FileDescriptor&& other) noexcept : _fd(std::exchange(other._fd, kNone)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  ~FileDescriptor();

  Native get() const noexcept { return _fd; }
  explicit operator bool() const noexcept { return _fd != kNone; }

 private:
  Native _fd = kNone;
};

// Opens for reading; throws std::system_error naming the path.
FileDescriptor open_for_reading(const std::filesystem::path& path);

// Opens with O_DIRECT (FILE_FLAG_NO_BUFFERING on Windows), or returns an empty descriptor with
// errno set where the file system refuses it (EINVAL on tmpfs and others).
FileDescriptor try_open_direct(const std::filesystem::path& path);

// Creates (or truncates) `path` for writing, binary; throws std::system_error naming the path.
FileDescriptor create_for_writing(const std::filesystem::path& path);

// Writes all `size` bytes at `offset`, retrying short writes; throws naming the path.
void write_exact(const FileDescriptor& fd, const void* buffer, std::size_t size,
                 std::uint64_t offset, const std::filesystem::path& path);

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
