// Small files that must survive a crash whole: read them, replace them atomically (temp file,
// fsync, rename, fsync of the directory), and an append-only file whose failed append is rolled
// back so that no torn record is left before later ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "platform/file_descriptor.hpp"

namespace ferry::detail::kv {

// Every file the KV store opens must be a regular file: a FIFO, device, socket or directory in
// its place (which would hang a read or feed it garbage) throws std::invalid_argument naming it.
void require_regular(const FileDescriptor& fd, const std::filesystem::path& path);

// The whole file, or nullopt where it does not exist; other failures throw naming the path.
std::optional<std::vector<std::byte>> read_if_exists(const std::filesystem::path& path);

// Replaces `path` with `bytes` (mode 0600) so that a crash leaves the old or the new file.
void write_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes);

void fsync_directory(const std::filesystem::path& directory);

class AppendFile {
 public:
  AppendFile() = default;
  // Opens an existing file for appending at `size` (bytes after it are cut off first).
  AppendFile(const std::filesystem::path& path, std::uint64_t size);
  // Appends and fdatasyncs (`sync` false: appends only); on any failure cuts the file back to
  // its old size and throws.
  void append(std::span<const std::byte> bytes, bool sync = true);
  std::uint64_t size() const { return _size; }

 private:
  FileDescriptor _fd;
  std::string _name;
  std::uint64_t _size = 0;
};

}  // namespace ferry::detail::kv
