#include "save/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <random>

#include "ferry/error.hpp"

namespace ferry::detail {
namespace {

// A name no other writer picks: hidden, beside the final file so that rename is atomic.
std::filesystem::path temporary_name(const std::filesystem::path& path) {
  static std::atomic<unsigned> counter{0};
  std::random_device random;
  return path.parent_path() /
         ("." + path.filename().string() + ".ferry-" + std::to_string(::getpid()) + "-" +
          std::to_string(counter++) + "-" + std::to_string(random()) + ".tmp");
}

}  // namespace

OutputFile::OutputFile(std::filesystem::path path, bool direct) : _path(std::move(path)) {
  FERRY_EXPECT(!_path.filename().empty(), std::invalid_argument, _path.string(),
               ": not a file name");
  _temporary = temporary_name(_path);
  // 0666 before the umask, as other writers (safetensors, open()) create files.
  constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
  if (direct) {
    _fd = FileDescriptor(::open(_temporary.c_str(), kFlags | O_DIRECT, 0666));
    if (_fd) {
      _direct = true;
      _reason = "O_DIRECT";
      return;
    }
    if (errno != EINVAL)
      FERRY_SYSCALL_FAIL(_path.string(), ": cannot create a file in ",
                         _path.parent_path().string());
    _reason = "buffered: the file system refused O_DIRECT";
  } else {
    _reason = "buffered: asked for";
  }
  _fd = FileDescriptor(::open(_temporary.c_str(), kFlags, 0666));
  if (!_fd)
    FERRY_SYSCALL_FAIL(_path.string(), ": cannot create a file in ", _path.parent_path().string());
}

OutputFile::~OutputFile() {
  if (!_committed && _fd) ::unlink(_temporary.c_str());
}

void OutputFile::write_at(std::uint64_t offset, const void* data, std::size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::pwrite(_fd.get(), p, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && _direct) {
        // Some file systems accept O_DIRECT at open and refuse it per write: go buffered.
        std::lock_guard lock(_reason_mutex);
        const int flags = ::fcntl(_fd.get(), F_GETFL);
        if (flags >= 0 && ::fcntl(_fd.get(), F_SETFL, flags & ~O_DIRECT) == 0) {
          _direct = false;
          _reason = "buffered: the file system refused an O_DIRECT write";
          continue;
        }
      }
      FERRY_SYSCALL_FAIL(_path.string(), ": write of ", size, " bytes at offset ", offset,
                         " failed");
    }
    if (n == 0)
      detail::fail_errno(EIO, _path.string(), ": write at offset ", offset, " made no progress");
    p += n;
    offset += static_cast<std::uint64_t>(n);
    size -= static_cast<std::size_t>(n);
  }
}

std::string OutputFile::io_reason() const {
  std::lock_guard lock(_reason_mutex);
  return _reason;
}

void OutputFile::commit(std::uint64_t size) {
  if (::ftruncate(_fd.get(), static_cast<off_t>(size)) != 0)
    FERRY_SYSCALL_FAIL(_path.string(), ": cannot set the size to ", size);
  if (::fsync(_fd.get()) != 0) FERRY_SYSCALL_FAIL(_path.string(), ": fsync failed");
  if (::rename(_temporary.c_str(), _path.c_str()) != 0)
    FERRY_SYSCALL_FAIL(_path.string(), ": cannot rename ", _temporary.filename().string(),
                       " to it");
  _committed = true;
  // The rename itself is durable once the directory is synced; a failure here loses nothing.
  const auto directory =
      _path.parent_path().empty() ? std::filesystem::path(".") : _path.parent_path();
  FileDescriptor dir(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir) ::fsync(dir.get());
}

}  // namespace ferry::detail
