// The safetensors format, validated before any tensor byte is read.
//
// Byte layout:
//   [0, 8)        N: header length, unsigned 64-bit little-endian
//   [8, 8+N)      UTF-8 JSON object:
//                   "__metadata__": {string: string}            (optional)
//                   "<tensor>": {"dtype": "BF16", "shape": [d0, ...],
//                                "data_offsets": [begin, end]}  (relative to 8+N)
//   [8+N, size)   tensor data; bytes after the last tensor are padding and are ignored.
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

struct SafetensorsHeader {
  std::uint64_t data_start = 0;                 // 8 + N
  std::vector<TensorInfo> tensors;              // sorted by offset, file_index 0
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// Parses a whole header. `prefix` holds the file's first bytes (at least 8 + N of them);
// `file_size` is the size of the whole file; `label` names the file in error messages.
// Throws FormatError on any defect.
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> prefix,
                                           std::uint64_t file_size, std::string_view label);

// Reads and parses the header of a file on disk.
SafetensorsHeader read_safetensors_header(const std::filesystem::path& path);

}  // namespace ferry
