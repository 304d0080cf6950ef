// A checkpoint: one safetensors file, or a directory of shards (with or without
// model.safetensors.index.json); or one GGUF file, or a directory of GGUF files (split GGUF).
// Opening parses and validates every header; no tensor data is read until a load. The files
// parsed stay in the checkpoint's file set, so a load reads exactly those files even if a path
// is later replaced (an atomic rename) or deleted; a file closed to stay under the descriptor
// limit is checked for the same identity when reopened.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/file_set.hpp"
#include "ferry/gguf_metadata.hpp"
#include "ferry/tensor_info.hpp"

namespace ferry {

namespace detail {
class NameIndex;
}

// A file is GGUF when it starts with the bytes "GGUF" or is named *.gguf (Ollama's blobs have
// no extension); otherwise safetensors. One checkpoint holds files of one format.
enum class CheckpointFormat { Safetensors, Gguf };

constexpr std::string_view checkpoint_format_name(CheckpointFormat format) noexcept {
  return format == CheckpointFormat::Gguf ? "gguf" : "safetensors";
}

// An index (model.safetensors.index.json) larger than this is refused before it is read: real
// ones hold some MB even for 100,000s of tensors. Index files must be regular files.
inline constexpr std::uint64_t kSafetensorsMaxIndexBytes = 100ull << 20;

struct CheckpointFile {
  std::filesystem::path path;
  std::uint64_t size = 0;
  // safetensors: "__metadata__". GGUF: every scalar value as text (gguf_value_text); arrays are
  // only in metadata_json.
  std::map<std::string, std::string> metadata;
  // safetensors: the header has a "__metadata__" object (empty or not): safetensors' Python API
  // returns None without one and {} for an empty one.
  bool has_metadata = false;
  CheckpointFormat format = CheckpointFormat::Safetensors;
  std::uint64_t data_start = 0;  // where tensor data begins
  // GGUF only (0 and empty otherwise): the version, the alignment of tensor data, and every
  // key-value pair, typed, arrays in full (tokenizer vocabularies included), as the JSON object
  // gguf_metadata_json writes.
  std::uint32_t gguf_version = 0;
  std::uint64_t gguf_alignment = 0;
  std::vector<GgufKeyValue> gguf_metadata;  // in file order
  // gguf_metadata as JSON, built on demand: arrays take several times their file size as
  // JSON text, which a load never needs. Empty for safetensors.
  std::string metadata_json() const;
};

class Checkpoint {
 public:
  // Throws std::system_error for a path that cannot be opened, FormatError for a malformed
  // file or index, std::invalid_argument for a path holding a NUL or naming neither a regular
  // file nor a directory. All name the file.
  static Checkpoint open(const std::filesystem::path& path);
  // The same, shared: what load() takes, and what keeps the description alive under its tensors.
  static std::shared_ptr<const Checkpoint> open_shared(const std::filesystem::path& path);

  const std::filesystem::path& path() const noexcept { return _path; }
  const std::vector<CheckpointFile>& files() const noexcept { return _files; }
  CheckpointFormat format() const noexcept { return _format; }
  // In read order: by file, then by offset.
  const std::vector<TensorInfo>& tensors() const noexcept { return _tensors; }
  // nullptr when absent.
  const TensorInfo* find(std::string_view name) const;
  std::uint64_t total_bytes() const noexcept { return _total_bytes; }
  // The files, in files() order, kept open for loads.
  const FileSet& file_set() const noexcept { return *_file_set; }
  std::shared_ptr<const FileSet> shared_file_set() const noexcept { return _file_set; }

 private:
  void add_file(const std::filesystem::path& file);
  void add_file_unguarded(const std::filesystem::path& file);
  void index_names();

  std::filesystem::path _path;
  std::shared_ptr<FileSet> _file_set;
  std::vector<CheckpointFile> _files;
  std::vector<TensorInfo> _tensors;
  // Immutable once built, so copies of the checkpoint share it.
  std::shared_ptr<const detail::NameIndex> _by_name;
  std::uint64_t _total_bytes = 0;
  CheckpointFormat _format = CheckpointFormat::Safetensors;
};

}  // namespace ferry
