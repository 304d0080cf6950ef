// The fixture of the safetensors header tests (test_safetensors.cpp, test_safetensors_malformed.cpp):
// files written from bytes, the checks of a refusal, and the pieces hand-made headers are built of.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/error.hpp"
#include "ferry/safetensors.hpp"
#include "test_support.hpp"

namespace ferry::safetensors_test {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// Eight little-endian bytes, for header lengths that lie.
inline std::string u64le(std::uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}

inline Json tensor_entry(std::string_view dtype, std::vector<std::uint64_t> shape, std::uint64_t begin,
                  std::uint64_t end) {
  return {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, end}}};
}

inline std::span<const std::byte> as_bytes(const std::string& text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

class SafetensorsTest : public ::testing::Test {
 protected:
  std::filesystem::path write(const std::string& bytes, const std::string& name = "t.safetensors") {
    auto path = dir / name;
    test::write_file(path, bytes);
    return path;
  }

  SafetensorsHeader read(const std::string& bytes) { return read_safetensors_header(write(bytes)); }

  // The file must be refused with a FormatError naming it and saying `word`.
  void expect_format_error(const std::string& bytes, const std::string& word) {
    const auto path = write(bytes, "bad.safetensors");
    try {
      read_safetensors_header(path);
      ADD_FAILURE() << "no FormatError; expected one saying \"" << word << "\"";
    } catch (const FormatError& e) {
      EXPECT_THAT(e.what(), HasSubstr(path.string()));
      EXPECT_THAT(e.what(), HasSubstr(word));
    }
  }

  // A well-formed header text whose data section holds `data_bytes` bytes.
  void expect_header_error(const std::string& header_json, std::size_t data_bytes,
                           const std::string& word) {
    expect_format_error(test::raw_safetensors(header_json, std::string(data_bytes, 'x')), word);
  }

  test::TempDir dir;
};

}  // namespace ferry::safetensors_test
