#include "kv/durable_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "ferry/error.hpp"

namespace ferry::detail::kv {
namespace {

void write_all(int fd, const std::byte* data, std::size_t size, std::uint64_t offset,
               const std::string& name) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      FERRY_SYSCALL_FAIL(name, ": write of ", size, " bytes at offset ", offset, " failed");
    }
    if (n == 0) {
      errno = ENOSPC;
      FERRY_SYSCALL_FAIL(name, ": write of ", size, " bytes at offset ", offset, " failed");
    }
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

std::optional<std::vector<std::byte>> read_if_exists(const std::filesystem::path& path) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT) return std::nullopt;
    FERRY_SYSCALL_FAIL(path.string(), ": cannot open");
  }
  std::vector<std::byte> bytes(file_size(fd, path));
  bytes.resize(read_up_to(fd, bytes.data(), bytes.size(), 0, path));  // may have shrunk
  return bytes;
}

void fsync_directory(const std::filesystem::path& directory) {
  FileDescriptor fd(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) FERRY_SYSCALL_FAIL(directory.string(), ": cannot open directory");
  if (::fsync(fd.get()) != 0) FERRY_SYSCALL_FAIL(directory.string(), ": fsync of directory");
}

void write_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  const std::filesystem::path temp = path.string() + ".tmp." + std::to_string(::getpid());
  ::unlink(temp.c_str());  // left by a crash of an earlier process with this pid
  {
    FileDescriptor fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd) FERRY_SYSCALL_FAIL(temp.string(), ": cannot create");
    try {
      write_all(fd.get(), bytes.data(), bytes.size(), 0, temp.string());
      if (::fsync(fd.get()) != 0) FERRY_SYSCALL_FAIL(temp.string(), ": fsync");
    } catch (...) {
      ::unlink(temp.c_str());
      throw;
    }
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    detail::fail_errno(error, path.string(), ": cannot rename ", temp.string(), " over it");
  }
  fsync_directory(path.parent_path());
}

AppendFile::AppendFile(const std::filesystem::path& path, std::uint64_t size)
    : _fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC)), _name(path.string()), _size(size) {
  if (!_fd) FERRY_SYSCALL_FAIL(_name, ": cannot open for appending");
  struct stat st {};
  if (::fstat(_fd.get(), &st) != 0) FERRY_SYSCALL_FAIL(_name);
  if (static_cast<std::uint64_t>(st.st_size) != size) {
    if (::ftruncate(_fd.get(), static_cast<off_t>(size)) != 0)
      FERRY_SYSCALL_FAIL(_name, ": cannot cut the torn tail at ", size);
    if (::fdatasync(_fd.get()) != 0) FERRY_SYSCALL_FAIL(_name, ": fdatasync");
  }
}

void AppendFile::append(std::span<const std::byte> bytes) {
  try {
    write_all(_fd.get(), bytes.data(), bytes.size(), _size, _name);
    if (::fdatasync(_fd.get()) != 0) FERRY_SYSCALL_FAIL(_name, ": fdatasync");
  } catch (...) {
    // No partial record may stay before later ones: replay would stop at it. If even the cut
    // fails, the next append at _size overwrites the partial bytes anyway.
    if (::ftruncate(_fd.get(), static_cast<off_t>(_size)) == 0) ::fdatasync(_fd.get());
    throw;
  }
  _size += bytes.size();
}

}  // namespace ferry::detail::kv
