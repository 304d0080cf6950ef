// GGUF metadata: the thirteen value types, typed values as a GGUF file holds them, and their
// renderings as text (for people and CheckpointFile::metadata) and as JSON (for tools).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace ferry {

// The type ids GGUF writes before every value (gguf's `enum gguf_type`).
enum class GgufValueType : std::uint32_t {
  Uint8 = 0,
  Int8 = 1,
  Uint16 = 2,
  Int16 = 3,
  Uint32 = 4,
  Int32 = 5,
  Float32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  Uint64 = 10,
  Int64 = 11,
  Float64 = 12,
};

inline constexpr std::uint32_t kGgufValueTypeCount = 13;

// "UINT8", "FLOAT32", "STRING", "ARRAY"... as the gguf package spells them.
std::string_view gguf_value_type_name(GgufValueType type) noexcept;

// Bytes of one value of a fixed-size type (the numbers and BOOL); 0 for STRING and ARRAY.
std::size_t gguf_value_size(GgufValueType type) noexcept;

struct GgufValue;

// An array. Fixed-size elements stay the file's little-endian bytes, so a 150k-entry token
// type array costs 600 KB rather than 150k values; strings and nested arrays are decoded.
struct GgufArray {
  GgufValueType element_type = GgufValueType::Uint8;
  std::uint64_t size = 0;
  std::vector<std::byte> fixed;      // size * gguf_value_size(element_type) bytes
  std::vector<std::string> strings;  // when element_type is String
  std::vector<GgufValue> arrays;     // when element_type is Array
};

struct GgufValue {
  GgufValueType type = GgufValueType::Uint8;
  // UINT8..UINT64: uint64_t; INT8..INT64: int64_t; FLOAT32 and FLOAT64: double (FLOAT32
  // widened exactly); BOOL: bool; STRING: the bytes as written (UTF-8 by the spec, not checked);
  // ARRAY: GgufArray.
  std::variant<std::uint64_t, std::int64_t, double, bool, std::string, GgufArray> value;
};

struct GgufKeyValue {
  std::string key;
  GgufValue value;
};

// Element `index` of an array of fixed-size elements, decoded (index < array.size).
GgufValue gguf_array_element(const GgufArray& array, std::uint64_t index);

// Scalars as text: strings as they are, "32", "-7", "1e-05" (shortest form that reads back to
// the same FLOAT32 or FLOAT64), "true"; arrays as "[N items of TYPE]".
std::string gguf_value_text(const GgufValue& value);

// The pairs as one JSON object, keys in file order, each value typed:
//   {"general.alignment": {"type": "UINT32", "value": 64},
//    "tokenizer.ggml.tokens": {"type": "ARRAY", "element_type": "STRING", "value": ["a", ...]},
//    "nested": {"type": "ARRAY", "element_type": "ARRAY",
//               "value": [{"type": "ARRAY", "element_type": "INT32", "value": [1, 2]}]}}
// Integers are exact (64-bit values included), floats the shortest text that reads back to the
// same value, non-finite floats the strings "nan", "inf" and "-inf". Bytes of a string that are
// not valid UTF-8 become U+FFFD, so the text is always valid JSON.
std::string gguf_metadata_json(std::span<const GgufKeyValue> metadata);

}  // namespace ferry
