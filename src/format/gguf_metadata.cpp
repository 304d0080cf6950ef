#include "ferry/gguf_metadata.hpp"

#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>

#include "ferry/error.hpp"

namespace ferry {
namespace {

struct ValueTypeEntry {
  std::string_view name;
  std::size_t size;
};

constexpr std::array<ValueTypeEntry, kGgufValueTypeCount> kValueTypes = {{
    {"UINT8", 1},
    {"INT8", 1},
    {"UINT16", 2},
    {"INT16", 2},
    {"UINT32", 4},
    {"INT32", 4},
    {"FLOAT32", 4},
    {"BOOL", 1},
    {"STRING", 0},
    {"ARRAY", 0},
    {"UINT64", 8},
    {"INT64", 8},
    {"FLOAT64", 8},
}};

std::uint64_t load_le(const std::byte* bytes, std::size_t size) {
  std::uint64_t value = 0;
  for (std::size_t i = size; i-- > 0;)
    value = (value << 8) | std::to_integer<std::uint64_t>(bytes[i]);
  return value;
}

// Shortest text that reads back to the same value, at the width the file stored.
std::string float_text(double value, GgufValueType type) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  char buffer[64];
  const auto result = type == GgufValueType::Float32
                          ? std::to_chars(buffer, buffer + sizeof buffer, static_cast<float>(value))
                          : std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

// The length of the valid UTF-8 sequence at `s[i]`, or 0 where it is not one (overlong forms,
// surrogates and code points past U+10FFFF included).
std::size_t utf8_sequence(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned lead = byte(i);
  std::size_t length = 0;
  unsigned min = 0;
  unsigned code = 0;
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0)
    length = 2, min = 0x80, code = lead & 0x1F;
  else if ((lead & 0xF0) == 0xE0)
    length = 3, min = 0x800, code = lead & 0x0F;
  else if ((lead & 0xF8) == 0xF0)
    length = 4, min = 0x10000, code = lead & 0x07;
  else
    return 0;
  if (s.size() - i < length) return 0;
  for (std::size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(i + k) & 0x3F);
  }
  if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return length;
}

void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
      ++i;
    } else if (c < 0x20) {
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 0xF];
      ++i;
    } else if (const std::size_t n = utf8_sequence(s, i); n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\\ufffd";
      ++i;
    }
  }
  out += '"';
}

void append_json(std::string& out, const GgufValue& value);

void append_json_scalar(std::string& out, const GgufValue& value) {
  if (const auto* u = std::get_if<std::uint64_t>(&value.value)) {
    out += std::to_string(*u);
  } else if (const auto* i = std::get_if<std::int64_t>(&value.value)) {
    out += std::to_string(*i);
  } else if (const auto* f = std::get_if<double>(&value.value)) {
    // JSON has no NaN or infinities: those become strings.
    const std::string text = float_text(*f, value.type);
    if (std::isfinite(*f))
      out += text;
    else
      append_json_string(out, text);
  } else if (const auto* b = std::get_if<bool>(&value.value)) {
    out += *b ? "true" : "false";
  } else if (const auto* s = std::get_if<std::string>(&value.value)) {
    append_json_string(out, *s);
  }
}

void append_json_array(std::string& out, const GgufArray& array) {
  out += "\"element_type\": \"";
  out += gguf_value_type_name(array.element_type);
  out += "\", \"value\": [";
  for (std::uint64_t k = 0; k < array.size; ++k) {
    if (k > 0) out += ", ";
    if (array.element_type == GgufValueType::String)
      append_json_string(out, array.strings[k]);
    else if (array.element_type == GgufValueType::Array)
      append_json(out, array.arrays[k]);
    else
      append_json_scalar(out, gguf_array_element(array, k));
  }
  out += ']';
}

// {"type": ..., "value": ...}, with "element_type" for arrays.
void append_json(std::string& out, const GgufValue& value) {
  out += "{\"type\": \"";
  out += gguf_value_type_name(value.type);
  out += "\", ";
  if (const auto* array = std::get_if<GgufArray>(&value.value)) {
    append_json_array(out, *array);
  } else {
    out += "\"value\": ";
    append_json_scalar(out, value);
  }
  out += '}';
}

}  // namespace

std::string_view gguf_value_type_name(GgufValueType type) noexcept {
  const auto index = static_cast<std::uint32_t>(type);
  return index < kGgufValueTypeCount ? kValueTypes[index].name : "?";
}

std::size_t gguf_value_size(GgufValueType type) noexcept {
  const auto index = static_cast<std::uint32_t>(type);
  return index < kGgufValueTypeCount ? kValueTypes[index].size : 0;
}

GgufValue gguf_array_element(const GgufArray& array, std::uint64_t index) {
  const std::size_t size = gguf_value_size(array.element_type);
  FERRY_ASSERT(size > 0 && index < array.size && array.fixed.size() == array.size * size);
  const std::uint64_t raw = load_le(array.fixed.data() + index * size, size);
  GgufValue out;
  out.type = array.element_type;
  switch (array.element_type) {
    case GgufValueType::Uint8:
    case GgufValueType::Uint16:
    case GgufValueType::Uint32:
    case GgufValueType::Uint64:
      out.value = raw;
      break;
    case GgufValueType::Int8:
      out.value = std::int64_t{static_cast<std::int8_t>(raw)};
      break;
    case GgufValueType::Int16:
      out.value = std::int64_t{static_cast<std::int16_t>(raw)};
      break;
    case GgufValueType::Int32:
      out.value = std::int64_t{static_cast<std::int32_t>(raw)};
      break;
    case GgufValueType::Int64:
      out.value = static_cast<std::int64_t>(raw);
      break;
    case GgufValueType::Float32:
      out.value = double{std::bit_cast<float>(static_cast<std::uint32_t>(raw))};
      break;
    case GgufValueType::Float64:
      out.value = std::bit_cast<double>(raw);
      break;
    case GgufValueType::Bool:
      out.value = raw != 0;
      break;
    default:
      FERRY_ASSERT(false);
  }
  return out;
}

std::string gguf_value_text(const GgufValue& value) {
  if (const auto* array = std::get_if<GgufArray>(&value.value))
    return "[" + std::to_string(array->size) + " items of " +
           std::string(gguf_value_type_name(array->element_type)) + "]";
  if (const auto* s = std::get_if<std::string>(&value.value)) return *s;
  if (const auto* f = std::get_if<double>(&value.value)) return float_text(*f, value.type);
  if (const auto* b = std::get_if<bool>(&value.value)) return *b ? "true" : "false";
  if (const auto* i = std::get_if<std::int64_t>(&value.value)) return std::to_string(*i);
  return std::to_string(std::get<std::uint64_t>(value.value));
}

std::string gguf_metadata_json(std::span<const GgufKeyValue> metadata) {
  std::string out = "{";
  for (std::size_t k = 0; k < metadata.size(); ++k) {
    out += k == 0 ? "\n  " : ",\n  ";
    append_json_string(out, metadata[k].key);
    out += ": ";
    append_json(out, metadata[k].value);
  }
  out += metadata.empty() ? "}" : "\n}";
  return out;
}

}  // namespace ferry
