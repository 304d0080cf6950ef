// A file being written: created under a temporary name in the destination's directory and
// renamed over the final name only after every byte is written and synced, so a crash or an
// error never leaves a half-written file under the final name. The bytes are written through
// the temporary path by the transfer core (save/span_writer.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "platform/file_descriptor.hpp"

namespace ferry::detail {

inline constexpr std::size_t kWriteAlignment = 4096;

class OutputFile {
 public:
  // Creates the temporary file beside `path`; throws std::system_error naming `path` when the
  // directory cannot be written.
  explicit OutputFile(std::filesystem::path path);
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();  // removes the temporary file unless committed

  // Cuts the file to `size`, syncs it, renames it to the final name and syncs the directory.
  void commit(std::uint64_t size);

  const std::filesystem::path& path() const noexcept { return _path; }
  const std::filesystem::path& temporary_path() const noexcept { return _temporary; }

 private:
  std::filesystem::path _path;
  std::filesystem::path _temporary;
  FileDescriptor _fd;
  bool _committed = false;
};

}  // namespace ferry::detail
