// The safetensors format, validated before any tensor byte is read.
//
// Byte layout:
//   [0, 8)        N: header length, unsigned 64-bit little-endian
//   [8, 8+N)      UTF-8 JSON object:
//                   "__metadata__": {string: string}            (optional)
//                   "<tensor>": {"dtype": "BF16", "shape": [d0, ...],
//                                "data_offsets": [begin, end]}  (relative to 8+N)
//   [8+N, size)   tensor data: the tensors back to back from 8+N, no holes. The header may end
//                 in spaces (JSON whitespace), never NUL bytes. Unknown fields of a tensor entry
//                 are ignored.
// safetensors accepts nothing after the last tensor; ferry accepts up to 4 KiB of zero bytes
// there (padding that writers of sub-byte dtypes leave), and refuses anything else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/tensor_info.hpp"

namespace ferry {

// A header larger than this is refused before it is allocated (safetensors' own limit).
inline constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100ull << 20;

// The most bytes that may follow the last tensor; all of them must be zero.
inline constexpr std::uint64_t kSafetensorsMaxTailBytes = 4096;

struct SafetensorsHeader {
  std::uint64_t data_start = 0;                 // 8 + N
  std::vector<TensorInfo> tensors;              // sorted by offset, file_index 0
  std::map<std::string, std::string> metadata;  // "__metadata__"
  bool has_metadata = false;  // "__metadata__" is present (an empty one included)
};

// Parses a whole header. `prefix` holds the file's first bytes (at least 8 + N of them);
// `file_size` is the size of the whole file; `label` names the file in error messages.
// Throws FormatError on any defect. Where `prefix` is the whole file, the bytes after the last
// tensor are checked too; otherwise only their count (see check_safetensors_tail).
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> prefix,
                                           std::uint64_t file_size, std::string_view label);

// Throws FormatError unless `tail`, the bytes after the last tensor, is zero padding of at most
// kSafetensorsMaxTailBytes.
void check_safetensors_tail(std::span<const std::byte> tail, std::string_view label);

// Reads and parses the header of a file on disk, and checks the bytes after the last tensor.
SafetensorsHeader read_safetensors_header(const std::filesystem::path& path);

}  // namespace ferry
