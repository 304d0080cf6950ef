// A checkpoint: one safetensors file, or a directory of shards (with or without
// model.safetensors.index.json). Opening parses and validates every header; no tensor data is
// read until a load.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ferry/tensor_info.hpp"

namespace ferry {

struct CheckpointFile {
  std::filesystem::path path;
  std::uint64_t size = 0;
  std::map<std::string, std::string> metadata;
};

class Checkpoint {
 public:
  // Throws std::system_error for a path that cannot be opened, FormatError for a malformed
  // file or index. Both name the file.
  static Checkpoint open(const std::filesystem::path& path);

  const std::filesystem::path& path() const noexcept { return _path; }
  const std::vector<CheckpointFile>& files() const noexcept { return _files; }
  // In read order: by file, then by offset.
  const std::vector<TensorInfo>& tensors() const noexcept { return _tensors; }
  // nullptr when absent.
  const TensorInfo* find(std::string_view name) const;
  std::uint64_t total_bytes() const noexcept { return _total_bytes; }

 private:
  void add_file(const std::filesystem::path& file);
  void index_names();

  std::filesystem::path _path;
  std::vector<CheckpointFile> _files;
  std::vector<TensorInfo> _tensors;
  std::unordered_map<std::string, std::size_t> _by_name;
  std::uint64_t _total_bytes = 0;
};

}  // namespace ferry
