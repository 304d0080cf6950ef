// The GGUF format (llama.cpp, Ollama), versions 2 and 3, little-endian, validated before any
// tensor byte is read.
//
// Byte layout (integers little-endian; a "string" is a u64 byte count, then the bytes, no NUL):
//   u32      magic, the bytes "GGUF"
//   u32      version: 2 or 3 (version 1 had u32 counts; a big-endian file reads as 2 or 3 swapped)
//   u64      tensor_count
//   u64      kv_count
//   kv_count times:
//     string key; u32 value_type; value
//       value: UINT8 INT8 UINT16 INT16 UINT32 INT32 FLOAT32 UINT64 INT64 FLOAT64 (their width),
//              BOOL (one byte, 0 or 1), STRING, or ARRAY = u32 element_type, u64 count, then
//              count values of that type without their type ids (arrays of arrays nest)
//   tensor_count times:
//     string name; u32 n_dims (<= 4); n_dims x u64 ne (ne[0] first: the length of a row);
//     u32 ggml_type; u64 offset (from the data section's start, a multiple of the alignment)
//   zero padding up to a multiple of the alignment (key "general.alignment", UINT32, a power of
//   two; 32 when absent)
//   data section: each tensor's rows, ne[0] elements (ne[0] / block_size blocks) per row
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

#include "ferry/gguf_metadata.hpp"
#include "ferry/tensor_info.hpp"

namespace ferry {

inline constexpr std::uint64_t kGgufDefaultAlignment = 32;
inline constexpr std::uint32_t kGgufMaxDims = 4;  // GGML_MAX_DIMS
// Arrays of arrays deeper than this are refused (ggml reads no nested arrays at all).
inline constexpr int kGgufMaxArrayDepth = 8;
// Everything before the data section must fit in this. Real headers, tokenizer included, take a
// few MB to a few tens of MB; the bound keeps a lying length from filling memory.
inline constexpr std::uint64_t kGgufMaxHeaderBytes = 256ull << 20;
// Counts past these are refused before anything is reserved for them: each key-value pair and
// each tensor costs ~100-250 bytes of memory for as few as 14 and 24 bytes of file, so a header
// of tiny records would cost 10x its size. Real files hold tens of keys (a tokenizer's
// vocabulary is one array) and thousands of tensors.
inline constexpr std::uint64_t kGgufMaxKeyValues = 1u << 16;
inline constexpr std::uint64_t kGgufMaxTensors = 1u << 20;

struct GgufHeader {
  std::uint32_t version = 0;
  std::uint64_t alignment = kGgufDefaultAlignment;
  std::uint64_t data_start = 0;        // end of the tensor infos, aligned up
  std::vector<GgufKeyValue> metadata;  // in file order
  // Sorted by offset, offsets absolute, file_index 0. Plain types (F32, F16, BF16, F64, I8..I64)
  // get their DType and shape = ne reversed (row-major, as numpy and torch write it); quantized
  // types get U8 and shape = ne reversed with the last entry (ne[0]) replaced by the bytes of a
  // row, so the shape's product is the byte size. ggml_type and ggml_dims keep what GGUF says.
  std::vector<TensorInfo> tensors;
};

// True when `prefix` starts with the GGUF magic.
bool has_gguf_magic(std::span<const std::byte> prefix) noexcept;

// True when the file at `path` starts with the GGUF magic. Throws std::system_error when it
// cannot be opened or read.
bool is_gguf_file(const std::filesystem::path& path);

// Parses a whole header. `prefix` holds the file's first bytes (all of the header);
// `file_size` is the size of the whole file; `label` names the file in error messages.
// Throws FormatError on any defect.
GgufHeader parse_gguf_header(std::span<const std::byte> prefix, std::uint64_t file_size,
                             std::string_view label);

// Reads and parses the header of a file on disk in growing pieces (1 MiB, then doubling), so
// that at most about twice the header, or 1 MiB, is ever read or held.
GgufHeader read_gguf_header(const std::filesystem::path& path);

}  // namespace ferry
