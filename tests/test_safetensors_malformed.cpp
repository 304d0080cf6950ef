// The safetensors header parser's refusals: one hand-made file per defect (the frame, the JSON,
// one tensor entry, once known defects), each a FormatError naming the file and the problem.
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
// Malformed files: the frame (length prefix and header bounds)

TEST_F(SafetensorsTest, MissingFileIsASystemErrorNamingIt) {
  const auto path = dir / "nope.safetensors";
  try {
    read_safetensors_header(path);
    FAIL() << "no error";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), std::errc::no_such_file_or_directory);
    EXPECT_THAT(e.what(), HasSubstr(path.string()));
  }
}

TEST_F(SafetensorsTest, EmptyFile) { expect_format_error("", "too short"); }

TEST_F(SafetensorsTest, FileShorterThanEightBytes) {
  expect_format_error("\x02\0\0\0", "too short");
}

TEST_F(SafetensorsTest, FileTruncatedInsideHeader) {
  const std::string whole =
      test::raw_safetensors(Json{{"w", tensor_entry("U8", {4}, 0, 4)}}.dump(), "abcd");
  expect_format_error(whole.substr(0, 20), "runs past the end");
}

TEST_F(SafetensorsTest, FileTruncatedInsideData) {
  const std::string whole = test::raw_safetensors(
      Json{{"w", tensor_entry("F32", {16}, 0, 64)}}.dump(), std::string(64, '\0'));
  expect_format_error(whole.substr(0, whole.size() - 1), "run past");
}

TEST_F(SafetensorsTest, HeaderLengthOneBytePastTheEnd) {
  const std::string json = "{}";
  expect_format_error(u64le(json.size() + 1) + json, "runs past the end");
}

TEST_F(SafetensorsTest, HeaderLengthHugeIsRefusedBeforeAllocating) {
  expect_format_error(u64le(0xFFFFFFFFFFFFFFFFull) + "{}", "exceeds the limit");
}

TEST_F(SafetensorsTest, HeaderLengthJustOverTheLimit) {
  expect_format_error(u64le(kSafetensorsMaxHeaderBytes + 1) + "{}", "exceeds the limit");
}

TEST_F(SafetensorsTest, EmptyHeader) { expect_format_error(u64le(0), "header is empty"); }

TEST_F(SafetensorsTest, EmptyHeaderFollowedByData) {
  expect_format_error(u64le(0) + "{}", "header is empty");
}

// ---------------------------------------------------------------------------------------------
// Malformed files: the JSON

TEST_F(SafetensorsTest, InvalidJson) {
  expect_header_error(R"({"w": {"dtype": "U8",)", 0, "not valid JSON");
}

TEST_F(SafetensorsTest, GarbageAfterTheJsonObject) {
  expect_header_error(R"({} {})", 0, "not valid JSON");
}

TEST_F(SafetensorsTest, HeaderOfZeroBytes) {
  expect_header_error(std::string(16, '\0'), 0, "NUL byte at offset 8");
}

TEST_F(SafetensorsTest, InvalidUtf8InHeader) {
  expect_header_error("{\"w\xff\": {}}", 0, "not valid JSON");
}

TEST_F(SafetensorsTest, JsonArrayIsNotAnObject) {
  expect_header_error(R"([{"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}])", 1,
                      "not an object");
}

TEST_F(SafetensorsTest, JsonStringIsNotAnObject) {
  expect_header_error(R"("hello")", 0, "not an object");
}

TEST_F(SafetensorsTest, DuplicateTensorName) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                          "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
                      2, "\"w\" appears twice");
}

TEST_F(SafetensorsTest, DuplicateMetadataKeyIsADuplicateName) {
  expect_header_error(R"({"__metadata__": {}, "__metadata__": {}})", 0, "twice");
}

TEST_F(SafetensorsTest, EmptyTensorName) {
  expect_header_error(R"({"": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})", 1,
                      "empty name");
}

TEST_F(SafetensorsTest, TensorEntryNotAnObject) {
  expect_header_error(R"({"w": [0, 1]})", 1, "not an object");
}

// ---------------------------------------------------------------------------------------------
// Malformed files: one tensor entry

TEST_F(SafetensorsTest, UnknownDType) {
  expect_header_error(R"({"w": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}})", 16,
                      "unknown dtype \"F128\"");
}

TEST_F(SafetensorsTest, DTypeNamesAreCaseSensitive) {
  expect_header_error(R"({"w": {"dtype": "f32", "shape": [1], "data_offsets": [0, 4]}})", 4,
                      "unknown dtype");
}

TEST_F(SafetensorsTest, DTypeNotAString) {
  expect_header_error(R"({"w": {"dtype": 7, "shape": [1], "data_offsets": [0, 1]}})", 1, "dtype");
}

TEST_F(SafetensorsTest, MissingDType) {
  expect_header_error(R"({"w": {"shape": [1], "data_offsets": [0, 1]}})", 1, "missing");
  expect_header_error(R"({"w": {"shape": [1], "data_offsets": [0, 1]}})", 1, "dtype");
}

TEST_F(SafetensorsTest, MissingShape) {
  expect_header_error(R"({"w": {"dtype": "U8", "data_offsets": [0, 1]}})", 1, "missing");
  expect_header_error(R"({"w": {"dtype": "U8", "data_offsets": [0, 1]}})", 1, "shape");
}

TEST_F(SafetensorsTest, ShapeNotAnArray) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": 1, "data_offsets": [0, 1]}})", 1, "shape");
}

TEST_F(SafetensorsTest, MissingDataOffsets) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [1]}})", 1, "data_offsets");
}

TEST_F(SafetensorsTest, DataOffsetsWithOneElement) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [1]}})", 1,
                      "data_offsets must be [begin, end]");
}

TEST_F(SafetensorsTest, DataOffsetsWithThreeElements) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}})", 2,
                      "data_offsets must be [begin, end]");
}

TEST_F(SafetensorsTest, DataOffsetsNotAnArray) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": {"a": 0, "b": 1}}})",
                      1, "data_offsets must be [begin, end]");
}

TEST_F(SafetensorsTest, DataOffsetNotAnInteger) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, "1"]}})", 1,
                      "data_offsets");
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]}})", 1,
                      "not a non-negative integer");
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0.0, 1.0]}})", 1,
                      "not a non-negative integer");
}

// Unknown fields of a tensor entry are ignored, as safetensors ignores them.
TEST_F(SafetensorsTest, UnknownExtraFieldInTensorEntryIsIgnored) {
  const auto parsed = read(test::raw_safetensors(
      R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "strides": [1],
               "note": {"deep": [1, 2]}}})",
      "x"));
  ASSERT_EQ(parsed.tensors.size(), 1u);
  EXPECT_EQ(parsed.tensors[0].size, 1u);
}

TEST_F(SafetensorsTest, ShapeElementCountOverflows64Bits) {
  expect_header_error(
      R"({"w": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", 0,
      "overflows 64 bits");
}

TEST_F(SafetensorsTest, ShapeBitCountOverflows64Bits) {
  // 2^60 elements fit in 64 bits; their 2^65 bits of F32 do not.
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [1152921504606846976],
                                "data_offsets": [0, 0]}})",
                      0, "overflows 64 bits");
}

TEST_F(SafetensorsTest, ShapeElementNegative) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}})", 1,
                      "not a non-negative integer");
}

TEST_F(SafetensorsTest, ShapeElementFloat) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [2.5], "data_offsets": [0, 2]}})", 2,
                      "not a non-negative integer");
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [2.0], "data_offsets": [0, 2]}})", 2,
                      "not a non-negative integer");
}

TEST_F(SafetensorsTest, ShapeElementNotANumber) {
  for (const char* dim : {R"("2")", "true", "null", "[2]", "{}"}) {
    SCOPED_TRACE(dim);
    expect_header_error(
        std::string(R"({"w": {"dtype": "U8", "shape": [)") + dim + R"(], "data_offsets": [0, 2]}})",
        2, "not a non-negative integer");
  }
}

TEST_F(SafetensorsTest, ShapeElementBeyondUint64) {
  expect_header_error(
      R"({"w": {"dtype": "U8", "shape": [18446744073709551616], "data_offsets": [0, 1]}})", 1,
      "not a non-negative integer");
}

TEST_F(SafetensorsTest, SizeMismatchTooFewBytes) {
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 8,
                      "needs 8 bytes but data_offsets hold 4");
}

TEST_F(SafetensorsTest, SizeMismatchTooManyBytes) {
  expect_header_error(R"({"w": {"dtype": "BF16", "shape": [3, 7], "data_offsets": [0, 43]}})", 43,
                      "needs 42 bytes");
}

TEST_F(SafetensorsTest, DataOffsetsOutOfBounds) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [100], "data_offsets": [0, 100]}})", 99,
                      "run past the 99 data bytes");
}

TEST_F(SafetensorsTest, DataOffsetsFarOutOfBounds) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [1],
                                "data_offsets": [18446744073709551614, 18446744073709551615]}})",
                      8, "run past");
}

TEST_F(SafetensorsTest, ReversedDataOffsets) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [8, 4]}})", 8,
                      "reversed");
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  expect_header_error(R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                          "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}})",
                      12, "overlap");
}

TEST_F(SafetensorsTest, TensorsSharingTheSameBytes) {
  expect_header_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                          "b": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})",
                      8, "overlap");
}

TEST_F(SafetensorsTest, TensorInsideAnother) {
  expect_header_error(R"({"a": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]},
                          "b": {"dtype": "U8", "shape": [2], "data_offsets": [6, 8]}})",
                      16, "overlap");
}

TEST_F(SafetensorsTest, F4WithOddElementCount) {
  expect_header_error(R"({"w": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}})", 2,
                      "does not fill whole bytes");
}

TEST_F(SafetensorsTest, F6NotFillingWholeBytes) {
  expect_header_error(R"({"w": {"dtype": "F6_E2M3", "shape": [2, 3], "data_offsets": [0, 5]}})", 5,
                      "does not fill whole bytes");
}

TEST_F(SafetensorsTest, MetadataValueNotAString) {
  expect_header_error(R"({"__metadata__": {"epoch": 3}})", 0, "\"epoch\" is not a string");
  expect_header_error(R"({"__metadata__": {"nested": {"a": "b"}}})", 0, "is not a string");
  expect_header_error(R"({"__metadata__": {"none": null}})", 0, "is not a string");
}

TEST_F(SafetensorsTest, MetadataNotAnObject) {
  expect_header_error(R"({"__metadata__": ["a", "b"]})", 0, "__metadata__ is not an object");
  expect_header_error(R"({"__metadata__": "text"})", 0, "__metadata__ is not an object");
}

// ---------------------------------------------------------------------------------------------
// Once known defects, now refused.

// An ambiguous entry: Hugging Face refuses it ("duplicate field `dtype`"); ferry takes the last.
TEST_F(SafetensorsTest, DuplicateFieldInTensorEntry) {
  expect_header_error(
      R"({"w": {"dtype": "U8", "dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4,
      "dtype");
}

// Deep nesting is refused while parsing, before anything recurses over it.
TEST_F(SafetensorsTest, DeeplyNestedShapeIsRefusedWithoutCrashing) {
  const std::size_t depth = 1'000'000;
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [)" + std::string(depth, '[') +
                          std::string(depth, ']') + R"(], "data_offsets": [0, 1]}})",
                      1, "nests deeper");
}

}  // namespace
}  // namespace ferry
