// Files opened once and kept for transfers: a checkpoint's shards, a KV store's slab files.
// Each file is opened when added, and its identity (device, inode, size, modification time)
// taken then. At most max_open() files stay open at once: the least recently used idle one is
// closed to make room, and reopening it checks that the path still names the same, unchanged
// file, else fails with a "changed underneath" error instead of reading a different file.
// Thread-safe; shared (std::shared_ptr) by whoever transfers to or from its files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>

namespace ferry {

enum class FileAccess {
  Read,       // read only; the file must exist and be a regular file
  ReadWrite,  // read and write; created (mode 0644) when missing
};

namespace detail {
class PlatformFile;
struct FileSetState;
}  // namespace detail

class FileSet {
 public:
  // `max_open` 0: a quarter of this process's descriptor limit (ulimit -n), 4 to 1024.
  static std::shared_ptr<FileSet> create(std::size_t max_open = 0);

  FileSet(const FileSet&) = delete;
  FileSet& operator=(const FileSet&) = delete;
  ~FileSet();

  // Opens `path` and adds it; returns its index. Throws std::system_error naming the path
  // (EMFILE as "too many open files"), std::invalid_argument for a non-regular file.
  std::uint32_t add(const std::filesystem::path& path, FileAccess access = FileAccess::Read);

  std::size_t size() const;
  const std::filesystem::path& path(std::uint32_t index) const;
  // The size the file had when it was added (read-only files keep it).
  std::uint64_t size_at_open(std::uint32_t index) const;
  std::size_t max_open() const noexcept;
  // Files open now (for tests and statistics).
  std::size_t open_now() const;

  // detail: the open file, reopened (and its identity checked) if it was closed; with
  // `want_direct` its unbuffered handle too, where the file system allows. The returned pointer
  // keeps it open; a file in use is never closed.
  std::shared_ptr<const detail::PlatformFile> acquire(std::uint32_t index, bool want_direct) const;

 private:
  explicit FileSet(std::size_t max_open);
  std::unique_ptr<detail::FileSetState> _state;
};

}  // namespace ferry
