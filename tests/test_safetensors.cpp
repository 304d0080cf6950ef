// The safetensors header parser: what it accepts, from a file and from a prefix in memory (its
// refusals of malformed files are in test_safetensors_malformed.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "ferry/error.hpp"
#include "ferry/safetensors.hpp"
#include "safetensors_fixture.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

using namespace safetensors_test;  // the fixture and the pieces of hand-made headers

// ---------------------------------------------------------------------------------------------
// Valid files

struct DTypeCase {
  const char* name;
  DType dtype;
  unsigned bits;
};

// Bit widths written out here rather than taken from dtype_bits, so that table is checked too.
constexpr DTypeCase kAllDTypes[] = {
    {"BOOL", DType::Bool, 8},       {"U8", DType::U8, 8},
    {"I8", DType::I8, 8},           {"U16", DType::U16, 16},
    {"I16", DType::I16, 16},        {"U32", DType::U32, 32},
    {"I32", DType::I32, 32},        {"U64", DType::U64, 64},
    {"I64", DType::I64, 64},        {"F16", DType::F16, 16},
    {"BF16", DType::BF16, 16},      {"F32", DType::F32, 32},
    {"F64", DType::F64, 64},        {"C64", DType::C64, 64},
    {"F8_E4M3", DType::F8_E4M3, 8}, {"F8_E4M3FNUZ", DType::F8_E4M3FNUZ, 8},
    {"F8_E5M2", DType::F8_E5M2, 8}, {"F8_E5M2FNUZ", DType::F8_E5M2FNUZ, 8},
    {"F8_E8M0", DType::F8_E8M0, 8}, {"F6_E2M3", DType::F6_E2M3, 6},
    {"F6_E3M2", DType::F6_E3M2, 6}, {"F4", DType::F4, 4},
};

TEST_F(SafetensorsTest, EveryDTypeHasItsByteSize) {
  // 3 x 4 x 2 = 24 elements fill whole bytes for the packed 4- and 6-bit types too.
  const std::vector<std::uint64_t> shape = {3, 4, 2};
  Json header = Json::object();
  std::uint64_t offset = 0;
  for (const auto& c : kAllDTypes) {
    const std::uint64_t size = c.bits * 24 / 8;
    header[std::string("t_") + c.name] = tensor_entry(c.name, shape, offset, offset + size);
    offset += size;
  }
  const std::string text = header.dump();
  const auto parsed = read(test::raw_safetensors(text, std::string(offset, '\0')));

  ASSERT_EQ(parsed.tensors.size(), std::size(kAllDTypes));
  for (const auto& c : kAllDTypes) {
    SCOPED_TRACE(c.name);
    const TensorInfo* found = nullptr;
    for (const auto& t : parsed.tensors)
      if (t.name == std::string("t_") + c.name) found = &t;
    ASSERT_NE(found, nullptr);
    EXPECT_EQ(found->dtype, c.dtype);
    EXPECT_EQ(dtype_name(found->dtype), c.name);
    EXPECT_EQ(dtype_bits(found->dtype), c.bits);
    EXPECT_EQ(found->shape, shape);
    EXPECT_EQ(found->size, c.bits * 24 / 8);
    EXPECT_EQ(found->file_index, 0u);
  }
}

TEST_F(SafetensorsTest, PackedTypesUseBitsTimesCountOverEight) {
  // F4: 2 elements per byte; F6: 4 elements per 3 bytes.
  const std::string header = Json{
      {"f4", tensor_entry("F4", {5, 2}, 0, 5)},
      {"f6a", tensor_entry("F6_E2M3", {4}, 5, 8)},
      {"f6b", tensor_entry("F6_E3M2", {2, 8}, 8,
                           20)}}.dump();
  const auto parsed = read(test::raw_safetensors(header, std::string(20, '\0')));
  ASSERT_EQ(parsed.tensors.size(), 3u);
  EXPECT_EQ(parsed.tensors[0].size, 5u);
  EXPECT_EQ(parsed.tensors[1].size, 3u);
  EXPECT_EQ(parsed.tensors[2].size, 12u);
}

TEST_F(SafetensorsTest, ZeroSizedTensorsAndScalars) {
  const std::string header = Json{{"empty", tensor_entry("F32", {0}, 0, 0)},
                                  {"empty3d", tensor_entry("BF16", {4, 0, 3}, 0, 0)},
                                  {"scalar", tensor_entry("F64", {}, 0, 8)},
                                  {"at_end", tensor_entry("U8", {0}, 8, 8)}}
                                 .dump();
  const auto parsed = read(test::raw_safetensors(header, std::string(8, '\0')));
  ASSERT_EQ(parsed.tensors.size(), 4u);
  for (const auto& t : parsed.tensors) {
    SCOPED_TRACE(t.name);
    if (t.name == "scalar") {
      EXPECT_TRUE(t.shape.empty());
      EXPECT_EQ(t.size, 8u);
    } else {
      EXPECT_EQ(t.size, 0u);
    }
  }
}

TEST_F(SafetensorsTest, MetadataIsParsed) {
  const std::string header = Json{
      {"__metadata__", {{"format", "pt"}, {"note", "ünïcode \"quoted\""}, {"empty", ""}}},
      {"w", tensor_entry("U8", {2}, 0,
                         2)}}.dump();
  const auto parsed = read(test::raw_safetensors(header, "ab"));
  EXPECT_EQ(parsed.metadata, (std::map<std::string, std::string>{
                                 {"format", "pt"}, {"note", "ünïcode \"quoted\""}, {"empty", ""}}));
  ASSERT_EQ(parsed.tensors.size(), 1u);  // __metadata__ is not a tensor
  EXPECT_EQ(parsed.tensors[0].name, "w");
}

TEST_F(SafetensorsTest, NoMetadataMeansEmptyMap) {
  const auto parsed =
      read(test::raw_safetensors(Json{{"w", tensor_entry("U8", {1}, 0, 1)}}.dump(), "a"));
  EXPECT_TRUE(parsed.metadata.empty());
}

TEST_F(SafetensorsTest, HeaderWithOnlyMetadataHasNoTensors) {
  const auto parsed = read(test::raw_safetensors(R"({"__metadata__":{"a":"b"}})", ""));
  EXPECT_TRUE(parsed.tensors.empty());
  EXPECT_EQ(parsed.metadata.at("a"), "b");
}

TEST_F(SafetensorsTest, EmptyObjectHeaderHasNoTensors) {
  const auto parsed = read(test::raw_safetensors("{}", ""));
  EXPECT_TRUE(parsed.tensors.empty());
  EXPECT_EQ(parsed.data_start, 10u);
}

TEST_F(SafetensorsTest, TrailingPaddingAfterLastTensorIsIgnored) {
  const std::string header = Json{{"w", tensor_entry("F32", {2}, 0, 8)}}.dump();
  const auto parsed = read(test::raw_safetensors(header, std::string(8 + 4096, '\0')));
  ASSERT_EQ(parsed.tensors.size(), 1u);
  EXPECT_EQ(parsed.tensors[0].size, 8u);
}

TEST_F(SafetensorsTest, HeaderPaddedWithSpacesIsAccepted) {
  // Hugging Face's writer pads the JSON with spaces to a multiple of 8 bytes.
  std::string header = Json{{"w", tensor_entry("U8", {3}, 0, 3)}}.dump();
  header.append(8 - header.size() % 8 + 8, ' ');
  const auto parsed = read(test::raw_safetensors(header, "abc"));
  EXPECT_EQ(parsed.data_start, 8 + header.size());
  ASSERT_EQ(parsed.tensors.size(), 1u);
  EXPECT_EQ(parsed.tensors[0].offset, parsed.data_start);
}

TEST_F(SafetensorsTest, OffsetsAreMadeAbsolute) {
  const std::string header =
      Json{{"a", tensor_entry("U8", {4}, 0, 4)}, {"b", tensor_entry("U16", {3}, 4, 10)}}.dump();
  const auto parsed = read(test::raw_safetensors(header, std::string(10, '\0')));
  EXPECT_EQ(parsed.data_start, 8 + header.size());
  ASSERT_EQ(parsed.tensors.size(), 2u);
  EXPECT_EQ(parsed.tensors[0].offset, parsed.data_start);
  EXPECT_EQ(parsed.tensors[1].offset, parsed.data_start + 4);
  EXPECT_EQ(parsed.tensors[1].size, 6u);
}

TEST_F(SafetensorsTest, TensorsAreSortedByOffset) {
  // Names in the reverse order of their offsets, so name order cannot pass for offset order.
  const std::string header = Json{
      {"a", tensor_entry("U8", {1}, 30, 31)},
      {"b", tensor_entry("U8", {10}, 20, 30)},
      {"c", tensor_entry("U8", {10}, 10, 20)},
      {"d", tensor_entry("U8", {10}, 0,
                         10)}}.dump();
  const auto parsed = read(test::raw_safetensors(header, std::string(31, '\0')));
  std::vector<std::string> names;
  for (const auto& t : parsed.tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"d", "c", "b", "a"}));
  for (std::size_t i = 1; i < parsed.tensors.size(); ++i)
    EXPECT_LT(parsed.tensors[i - 1].offset, parsed.tensors[i].offset);
}

// The format forbids holes in the data section (safetensors refuses them): a file with one could
// carry a second payload. (ferry accepted and read through them before it followed the spec.)
TEST_F(SafetensorsTest, HoleBetweenTensorsIsRefused) {
  const std::string header =
      Json{{"a", tensor_entry("U8", {4}, 100, 104)}, {"b", tensor_entry("U8", {4}, 0, 4)}}.dump();
  expect_format_error(test::raw_safetensors(header, std::string(104, '\0')),
                      "tensor \"a\" begins at data byte 100 but the tensor before it ends at 4");
}

TEST_F(SafetensorsTest, HoleBeforeTheFirstTensorIsRefused) {
  const std::string header = Json{{"a", tensor_entry("U8", {4}, 8, 12)}}.dump();
  expect_format_error(test::raw_safetensors(header, std::string(12, '\0')), "has a hole");
}

TEST_F(SafetensorsTest, TensorsOutOfOrderInTheHeaderAreSortedByOffset) {
  const std::string header =
      Json{{"a", tensor_entry("U8", {4}, 4, 8)}, {"b", tensor_entry("U8", {4}, 0, 4)}}.dump();
  const auto parsed = read(test::raw_safetensors(header, std::string(8, '\0')));
  ASSERT_EQ(parsed.tensors.size(), 2u);
  EXPECT_EQ(parsed.tensors[0].name, "b");
  EXPECT_EQ(parsed.tensors[0].offset, parsed.data_start);
  EXPECT_EQ(parsed.tensors[1].name, "a");
  EXPECT_EQ(parsed.tensors[1].offset, parsed.data_start + 4);
}

// ferry's one deliberate difference from safetensors: up to 4 KiB of zero bytes may follow the
// last tensor (safetensors accepts none); anything else there is refused.
TEST_F(SafetensorsTest, ZeroPaddingAfterTheLastTensorUpTo4KiB) {
  const std::string header = Json{{"a", tensor_entry("U8", {4}, 0, 4)}}.dump();
  const auto parsed = read(test::raw_safetensors(header, "abcd" + std::string(4096, '\0')));
  EXPECT_EQ(parsed.tensors.size(), 1u);
  expect_format_error(test::raw_safetensors(header, "abcd" + std::string(4097, '\0')),
                      "4097 bytes follow the last tensor");
}

TEST_F(SafetensorsTest, NonZeroBytesAfterTheLastTensorAreRefused) {
  const std::string header = Json{{"a", tensor_entry("U8", {4}, 0, 4)}}.dump();
  expect_format_error(test::raw_safetensors(header, "abcd<html>"), "byte 0 after the last tensor");
  expect_format_error(test::raw_safetensors(header, "abcd" + std::string(100, '\0') + "PK"),
                      "byte 100 after the last tensor is not zero");
  // A file with no tensors: everything after the header is "after the last tensor".
  expect_format_error(test::raw_safetensors("{}", "x"), "not zero");
}

TEST_F(SafetensorsTest, TailIsCheckedWhenTheWholeFileIsParsedFromMemory) {
  const std::string header = Json{{"a", tensor_entry("U8", {4}, 0, 4)}}.dump();
  const std::string good = test::raw_safetensors(header, "abcd" + std::string(16, '\0'));
  EXPECT_EQ(parse_safetensors_header(as_bytes(good), good.size(), "mem").tensors.size(), 1u);
  const std::string bad = test::raw_safetensors(header, "abcdZIP");
  EXPECT_THROW(parse_safetensors_header(as_bytes(bad), bad.size(), "mem"), FormatError);
}

TEST_F(SafetensorsTest, HeaderEndingInJsonWhitespaceIsAccepted) {
  const std::string header = Json{{"a", tensor_entry("U8", {4}, 0, 4)}}.dump() + "    \n\t ";
  EXPECT_EQ(read(test::raw_safetensors(header, "abcd")).tensors.size(), 1u);
}

TEST_F(SafetensorsTest, HeaderPaddedWithNulBytesIsRefused) {
  const std::string header = Json{{"a", tensor_entry("U8", {4}, 0, 4)}}.dump();
  expect_format_error(test::raw_safetensors(header + std::string(8, '\0'), "abcd"),
                      "header holds a NUL byte at offset " + std::to_string(8 + header.size()));
  // Whatever a lenient parser would skip after the NUL is refused too.
  expect_format_error(test::raw_safetensors(header + std::string(1, '\0') + "junk", "abcd"),
                      "NUL byte");
}

// Header parsing is linear in the tensor count (it was quadratic: 80,000 tensors ran for
// minutes); this checks the result at 100,000 tensors, never the time.
TEST_F(SafetensorsTest, HundredThousandTensors) {
  constexpr int kCount = 100000;
  std::string header = "{";
  for (int i = 0; i < kCount; ++i) {
    header += (i ? ",\"t" : "\"t") + std::to_string(i) +
              R"(":{"dtype":"U8","shape":[2],"data_offsets":[)" + std::to_string(2 * i) + "," +
              std::to_string(2 * i + 2) + "]}";
  }
  header += "}";
  const auto parsed = read(test::raw_safetensors(header, std::string(2 * kCount, '\0')));
  ASSERT_EQ(parsed.tensors.size(), static_cast<std::size_t>(kCount));
  for (int i = 0; i < kCount; ++i) {
    ASSERT_EQ(parsed.tensors[i].name, "t" + std::to_string(i));
    ASSERT_EQ(parsed.tensors[i].offset, parsed.data_start + 2 * i);
  }
}

TEST_F(SafetensorsTest, AdjacentZeroSizedTensorsDoNotOverlap) {
  const std::string header = Json{
      {"a", tensor_entry("U8", {0}, 4, 4)},
      {"b", tensor_entry("U8", {4}, 0, 4)},
      {"c", tensor_entry("U8", {4}, 4, 8)},
      {"d", tensor_entry("U8", {0}, 4,
                         4)}}.dump();
  const auto parsed = read(test::raw_safetensors(header, std::string(8, '\0')));
  EXPECT_EQ(parsed.tensors.size(), 4u);
}

TEST_F(SafetensorsTest, LargeShapeDimensionsWithoutOverflow) {
  // 2^30 x 2^30 elements of U8 is 2^60 bytes (2^63 bits): representable, so only the bounds
  // refuse it.
  expect_header_error(
      Json{{"w", tensor_entry("U8", {1ull << 30, 1ull << 30}, 0, 1ull << 60)}}.dump(), 0,
      "run past");
}

TEST_F(SafetensorsTest, MatchesWhatFerrysWriterWrote) {
  const std::vector<TensorSpec> specs = {
      {"z.weight", DType::BF16, {17, 33}}, {"a.bias", DType::F32, {7}}, {"m", DType::F4, {6, 2}}};
  const auto path = dir / "w.safetensors";
  const auto layout = write_safetensors(
      path, specs,
      [](const TensorSpec&, std::span<std::byte> b) { std::memset(b.data(), 0x5a, b.size()); },
      {{"k", "v"}});
  const auto parsed = read_safetensors_header(path);
  EXPECT_EQ(parsed.data_start % 8, 0u);
  EXPECT_EQ(parsed.metadata.at("k"), "v");
  ASSERT_EQ(parsed.tensors.size(), layout.size());
  for (std::size_t i = 0; i < layout.size(); ++i) {  // the writer packs in the order given
    EXPECT_EQ(parsed.tensors[i].name, layout[i].name);
    EXPECT_EQ(parsed.tensors[i].dtype, layout[i].dtype);
    EXPECT_EQ(parsed.tensors[i].shape, layout[i].shape);
    EXPECT_EQ(parsed.tensors[i].offset, layout[i].offset);
    EXPECT_EQ(parsed.tensors[i].size, layout[i].size);
  }
  EXPECT_EQ(parsed.tensors[2].size, 6u);
}

// ---------------------------------------------------------------------------------------------
// The in-memory entry point

TEST(ParseSafetensorsHeader, ParsesAPrefixInMemory) {
  const std::string header =
      Json{{"b", tensor_entry("I32", {2}, 4, 12)}, {"a", tensor_entry("I8", {4}, 0, 4)}}.dump();
  const std::string bytes = test::raw_safetensors(header, "");
  // Only the prefix is given; file_size says the data section exists on disk.
  const auto parsed = parse_safetensors_header(as_bytes(bytes), bytes.size() + 12, "mem");
  EXPECT_EQ(parsed.data_start, 8 + header.size());
  ASSERT_EQ(parsed.tensors.size(), 2u);
  EXPECT_EQ(parsed.tensors[0].name, "a");
  EXPECT_EQ(parsed.tensors[0].offset, parsed.data_start);
  EXPECT_EQ(parsed.tensors[1].name, "b");
  EXPECT_EQ(parsed.tensors[1].offset, parsed.data_start + 4);
  EXPECT_EQ(parsed.tensors[1].dtype, DType::I32);
}

TEST(ParseSafetensorsHeader, ExtraBytesInThePrefixAreIgnored) {
  const std::string header = Json{{"a", tensor_entry("U8", {4}, 0, 4)}}.dump();
  const std::string bytes = test::raw_safetensors(header, "abcd");
  const auto parsed = parse_safetensors_header(as_bytes(bytes), bytes.size(), "mem");
  ASSERT_EQ(parsed.tensors.size(), 1u);
  EXPECT_EQ(parsed.tensors[0].size, 4u);
}

// Throws FormatError; the message must carry the label and `word`.
void expect_parse_error(const std::string& bytes, std::uint64_t file_size,
                        const std::string& word) {
  try {
    parse_safetensors_header(as_bytes(bytes), file_size, "label-in-memory");
    ADD_FAILURE() << "no FormatError; expected one saying \"" << word << "\"";
  } catch (const FormatError& e) {
    EXPECT_THAT(e.what(), HasSubstr("label-in-memory"));
    EXPECT_THAT(e.what(), HasSubstr(word));
  }
}

TEST(ParseSafetensorsHeader, RefusesShortInput) {
  expect_parse_error("", 0, "too short");
  expect_parse_error("1234567", 7, "too short");
}

TEST(ParseSafetensorsHeader, RefusesAPrefixThatStopsInsideTheHeader) {
  const std::string bytes = test::raw_safetensors(R"({"__metadata__": {"a": "b"}})", "");
  expect_parse_error(bytes.substr(0, bytes.size() - 3), bytes.size(), "truncated");
}

TEST(ParseSafetensorsHeader, RefusesHugeHeaderLength) {
  expect_parse_error(u64le(~0ull), 1ull << 40, "exceeds the limit");
}

TEST(ParseSafetensorsHeader, RefusesOutOfBoundsOffsets) {
  const std::string bytes =
      test::raw_safetensors(Json{{"w", tensor_entry("U8", {4}, 0, 4)}}.dump(), "");
  expect_parse_error(bytes, bytes.size() + 3, "run past the 3 data bytes");
}

TEST(ParseSafetensorsHeader, RefusesUnknownDType) {
  const std::string bytes = test::raw_safetensors(
      R"({"w": {"dtype": "Q4_K", "shape": [1], "data_offsets": [0, 1]}})", "x");
  expect_parse_error(bytes, bytes.size(), "unknown dtype");
}

}  // namespace
}  // namespace ferry
