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

OutputFile::OutputFile(std::filesystem::path path) : _path(std::move(path)) {
  FERRY_EXPECT(!_path.filename().empty(), std::invalid_argument, _path.string(),
               ": not a file name");
  _temporary = temporary_name(_path);
  // 0666 before the umask, as other writers (safetensors, open()) create files.
  _fd = FileDescriptor(::open(_temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
  if (!_fd)
    FERRY_SYSCALL_FAIL(_path.string(), ": cannot create a file in ", _path.parent_path().string());
}

OutputFile::~OutputFile() {
  if (!_committed && _fd) ::unlink(_temporary.c_str());
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
