#include "kv/durable_file.hpp"

#include <cerrno>

#include "ferry/error.hpp"
#include "platform/file_ops.hpp"
#include "platform/system.hpp"

namespace ferry::detail::kv {
namespace {

void write_all(NativeDescriptor fd, const std::byte* data, std::size_t size, std::uint64_t offset,
               const std::string& name) {
  std::size_t done = 0;
  while (done < size) {
    const std::int64_t n = write_some_at(fd, data + done, size - done, offset + done);
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

void require_regular(const FileDescriptor& fd, const std::filesystem::path& path) {
  (void)file_size(fd, path);  // throws "not a regular file"
}

std::optional<std::vector<std::byte>> read_if_exists(const std::filesystem::path& path) {
  FileDescriptor fd = open_existing(path, false);
  if (!fd) {
    if (errno == ENOENT) return std::nullopt;
    FERRY_SYSCALL_FAIL(path.string(), ": cannot open");
  }
  std::vector<std::byte> bytes(file_size(fd, path));
  bytes.resize(read_up_to(fd, bytes.data(), bytes.size(), 0, path));  // may have shrunk
  return bytes;
}

void fsync_directory(const std::filesystem::path& directory) {
  if (!sync_directory(directory)) FERRY_SYSCALL_FAIL(directory.string(), ": fsync of directory");
}

void write_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::filesystem::path temp = path;  // a path, not a string: non-ASCII names stay whole on Windows
  temp += ".tmp." + std::to_string(process_id());
  remove_file(temp);  // left by a crash of an earlier process with this pid
  {
    FileDescriptor fd = create_new(temp, 0600);
    if (!fd) FERRY_SYSCALL_FAIL(temp.string(), ": cannot create");
    try {
      write_all(fd.get(), bytes.data(), bytes.size(), 0, temp.string());
      if (!sync_all(fd.get())) FERRY_SYSCALL_FAIL(temp.string(), ": fsync");
    } catch (...) {
      fd = FileDescriptor();  // closed first: Windows removes an open file only at its close
      remove_file(temp);
      throw;
    }
  }
  if (!rename_replacing(temp, path)) {
    const int error = errno;
    remove_file(temp);
    detail::fail_errno(error, path.string(), ": cannot rename ", temp.string(), " over it");
  }
  fsync_directory(path.parent_path());
}

AppendFile::AppendFile(const std::filesystem::path& path, std::uint64_t size)
    : _fd(open_existing(path, true)), _name(path.string()), _size(size) {
  if (!_fd) FERRY_SYSCALL_FAIL(_name, ": cannot open for appending");
  require_regular(_fd, path);
  const auto now = identity_of_open(_fd.get());
  if (!now) FERRY_SYSCALL_FAIL(_name);
  if (now->size != size) {
    if (!set_file_size(_fd.get(), size))
      FERRY_SYSCALL_FAIL(_name, ": cannot cut the torn tail at ", size);
    if (!sync_data(_fd.get())) FERRY_SYSCALL_FAIL(_name, ": fdatasync");
  }
}

void AppendFile::append(std::span<const std::byte> bytes, bool sync) {
  try {
    write_all(_fd.get(), bytes.data(), bytes.size(), _size, _name);
    if (sync && !sync_data(_fd.get())) FERRY_SYSCALL_FAIL(_name, ": fdatasync");
  } catch (...) {
    // No partial record may stay before later ones: replay would stop at it. If even the cut
    // fails, the next append at _size overwrites the partial bytes anyway.
    if (set_file_size(_fd.get(), _size)) sync_data(_fd.get());
    throw;
  }
  _size += bytes.size();
}

}  // namespace ferry::detail::kv
