// Hand-made GGUF bytes for the tests: every field written out, nothing validated, so a test can
// make exactly the defect it wants (a count that lies, a type id that does not exist...).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/gguf_metadata.hpp"

namespace ferry::test {

// `width` little-endian bytes of `value`.
inline std::string le(std::uint64_t value, int width) {
  std::string out(static_cast<std::size_t>(width), '\0');
  for (int i = 0; i < width; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<char>(value >> (8 * i));
  return out;
}

inline std::string u32(std::uint64_t value) { return le(value, 4); }
inline std::string u64(std::uint64_t value) { return le(value, 8); }

// A GGUF string: u64 length, then the bytes.
inline std::string gstr(std::string_view text) { return u64(text.size()) + std::string(text); }

inline std::string type_id(GgufValueType type) { return u32(static_cast<std::uint32_t>(type)); }

// One key-value pair: key, value type, and the value's encoding as given.
inline std::string kv(std::string_view key, GgufValueType type, const std::string& payload) {
  return gstr(key) + type_id(type) + payload;
}

// The payload of an ARRAY value: element type, count, the elements' encodings concatenated.
inline std::string array_payload(GgufValueType element, std::uint64_t count,
                                 const std::string& elements) {
  return type_id(element) + u64(count) + elements;
}

// One tensor info record.
inline std::string tensor_info(std::string_view name, const std::vector<std::uint64_t>& dims,
                               std::uint32_t ggml_type, std::uint64_t offset) {
  std::string out = gstr(name) + u32(dims.size());
  for (auto d : dims) out += u64(d);
  return out + u32(ggml_type) + u64(offset);
}

struct GgufBytes {
  std::string magic = "GGUF";
  std::uint32_t version = 3;
  std::vector<std::string> kvs;               // encoded pairs
  std::vector<std::string> tensors;           // encoded tensor infos
  std::optional<std::uint64_t> kv_count;      // the real count when unset
  std::optional<std::uint64_t> tensor_count;  // the real count when unset
  std::uint64_t alignment = 32;  // of the padding before `data` (the file says its own)
  std::string data;

  std::string header() const {
    std::string out = magic + u32(version) + u64(tensor_count.value_or(tensors.size())) +
                      u64(kv_count.value_or(kvs.size()));
    for (const auto& k : kvs) out += k;
    for (const auto& t : tensors) out += t;
    return out;
  }

  std::string build() const {
    std::string out = header();
    out.append((alignment - out.size() % alignment) % alignment, '\0');
    return out + data;
  }
};

}  // namespace ferry::test
