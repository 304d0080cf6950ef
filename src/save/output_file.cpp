#include "save/output_file.hpp"

#include <atomic>
#include <cerrno>
#include <random>

#include "ferry/error.hpp"
#include "platform/file_ops.hpp"
#include "platform/system.hpp"

namespace ferry::detail {
namespace {

// A name no other writer picks: hidden, beside the final file so that rename is atomic.
std::filesystem::path temporary_name(const std::filesystem::path& path) {
  static std::atomic<unsigned> counter{0};
  std::random_device random;
  // Joined as paths, not strings: mingw's path(std::string) would not read the name as UTF-8.
  std::filesystem::path name = ".";
  name += path.filename();
  name += ".ferry-" + std::to_string(process_id()) + "-" + std::to_string(counter++) + "-" +
          std::to_string(random()) + ".tmp";
  return path.parent_path() / name;
}

}  // namespace

OutputFile::OutputFile(std::filesystem::path path) : _path(std::move(path)) {
  FERRY_EXPECT(!_path.filename().empty(), std::invalid_argument, _path.string(),
               ": not a file name");
  _temporary = temporary_name(_path);
  // 0666 before the umask, as other writers (safetensors, open()) create files.
  _fd = create_new(_temporary, 0666);
  if (!_fd)
    FERRY_SYSCALL_FAIL(_path.string(), ": cannot create a file in ", _path.parent_path().string());
}

OutputFile::~OutputFile() {
  if (!_committed && _fd) remove_file(_temporary);
}

void OutputFile::commit(std::uint64_t size) {
  if (!set_file_size(_fd.get(), size))
    FERRY_SYSCALL_FAIL(_path.string(), ": cannot set the size to ", size);
  if (!sync_all(_fd.get())) FERRY_SYSCALL_FAIL(_path.string(), ": fsync failed");
  if (!rename_replacing(_temporary, _path))
    FERRY_SYSCALL_FAIL(_path.string(), ": cannot rename ", _temporary.filename().string(),
                       " to it");
  _committed = true;
  // The rename itself is durable once the directory is synced; a failure here loses nothing.
  const auto directory =
      _path.parent_path().empty() ? std::filesystem::path(".") : _path.parent_path();
  sync_directory(directory);
}

}  // namespace ferry::detail
