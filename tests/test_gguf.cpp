// The GGUF reader: ggml's type table, what the reader accepts, and one hand-made file per defect
// it must refuse with a FormatError naming the file and the problem. GGUF checkpoints through the
// plan and the engine are in test_checkpoint.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ferry/error.hpp"
#include "ferry/ggml_type.hpp"
#include "ferry/gguf.hpp"
#include "gguf_bytes.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using test::array_payload;
using test::gstr;
using test::kv;
using test::tensor_info;
using test::u32;
using test::u64;
using ::testing::HasSubstr;
using VT = GgufValueType;

constexpr std::uint32_t kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ8_0 = 8, kQ4_K = 12, kBF16 = 30;

// ---------------------------------------------------------------------------------------------
// ggml's types

struct TypeCase {
  std::uint32_t id;
  const char* name;
  std::uint32_t block, bytes;
};

// Written out here from ggml's block structs (and the gguf package's GGML_QUANT_SIZES), so the
// table in src/ggml_type.cpp is checked against a second copy.
constexpr TypeCase kAllTypes[] = {
    {0, "F32", 1, 4},         {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},      {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 40},      {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},
    {17, "IQ2_XS", 256, 74},  {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},        {27, "I64", 1, 8},        {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 56},   {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},    {40, "NVFP4", 64, 36},
    {41, "Q1_0", 128, 18},
};

TEST(GgmlType, EveryTypeHasItsBlockSizeAndBytes) {
  for (const auto& c : kAllTypes) {
    SCOPED_TRACE(c.name);
    const GgmlTypeTraits* t = find_ggml_type(c.id);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(static_cast<std::uint32_t>(t->type), c.id);
    EXPECT_EQ(t->name, c.name);
    EXPECT_EQ(t->block_size, c.block);
    EXPECT_EQ(t->type_size, c.bytes);
    EXPECT_EQ(ggml_type_name(c.id), c.name);
  }
}

TEST(GgmlType, PlainTypesMapToDTypes) {
  EXPECT_EQ(ggml_type_traits(GgmlType::F32).dtype, DType::F32);
  EXPECT_EQ(ggml_type_traits(GgmlType::BF16).dtype, DType::BF16);
  EXPECT_EQ(ggml_type_traits(GgmlType::I64).dtype, DType::I64);
  EXPECT_EQ(ggml_type_traits(GgmlType::F64).dtype, DType::F64);
  EXPECT_FALSE(ggml_type_traits(GgmlType::Q4_K).dtype.has_value());
  EXPECT_FALSE(ggml_type_traits(GgmlType::MXFP4).dtype.has_value());
}

TEST(GgmlType, RetiredAndFutureIdsAreUnknown) {
  for (std::uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 42u, 99u, 0xFFFFFFFFu}) {
    SCOPED_TRACE(id);
    EXPECT_EQ(find_ggml_type(id), nullptr);
    EXPECT_EQ(ggml_type_name(id), "?");
  }
  EXPECT_EQ(ggml_type_name(-1), "?");
}

TEST(GgmlType, RowBytesNeedWholeBlocks) {
  const auto& q4_0 = ggml_type_traits(GgmlType::Q4_0);
  EXPECT_EQ(ggml_row_bytes(q4_0, 64), 36u);
  EXPECT_EQ(ggml_row_bytes(q4_0, 0), 0u);
  EXPECT_EQ(ggml_row_bytes(q4_0, 33), std::nullopt);
  EXPECT_EQ(ggml_row_bytes(ggml_type_traits(GgmlType::Q4_K), 4096), 16u * 144);
  EXPECT_EQ(ggml_row_bytes(ggml_type_traits(GgmlType::F64), 1ull << 61), std::nullopt);
}

// ---------------------------------------------------------------------------------------------
// The reader

class GgufTest : public ::testing::Test {
 protected:
  fs::path write(const std::string& bytes, const std::string& name = "t.gguf") {
    auto path = dir / name;
    test::write_file(path, bytes);
    return path;
  }

  GgufHeader read(const test::GgufBytes& file) { return read_gguf_header(write(file.build())); }

  // The file must be refused with a FormatError naming it and saying every one of `words`.
  void expect_error(const std::string& bytes, const std::vector<std::string>& words) {
    const auto path = write(bytes, "bad.gguf");
    try {
      read_gguf_header(path);
      ADD_FAILURE() << "no FormatError; expected one saying \"" << words.front() << "\"";
    } catch (const FormatError& e) {
      EXPECT_THAT(e.what(), HasSubstr(path.string()));
      for (const auto& word : words) EXPECT_THAT(e.what(), HasSubstr(word));
    }
  }
  void expect_error(const test::GgufBytes& file, const std::vector<std::string>& words) {
    expect_error(file.build(), words);
  }

  // A file holding one tensor `w` and its data.
  static test::GgufBytes one_tensor(const std::vector<std::uint64_t>& dims, std::uint32_t type,
                                    std::uint64_t data_bytes, std::uint64_t offset = 0) {
    test::GgufBytes f;
    f.kvs.push_back(kv("general.architecture", VT::String, gstr("llama")));
    f.tensors.push_back(tensor_info("w", dims, type, offset));
    f.data.assign(data_bytes, '\x5a');
    return f;
  }

  test::TempDir dir;
};

TEST_F(GgufTest, EveryMetadataValueType) {
  test::GgufBytes f;
  f.version = 2;  // counts are u64 in versions 2 and 3 alike
  f.kvs = {
      kv("u8", VT::Uint8, "\xff"),
      kv("i8", VT::Int8, "\x80"),
      kv("u16", VT::Uint16, u32(0xBEEF).substr(0, 2)),
      kv("i16", VT::Int16, std::string("\x00\x80", 2)),
      kv("u32", VT::Uint32, u32(4000000000u)),
      kv("i32", VT::Int32, u32(static_cast<std::uint32_t>(-7))),
      kv("f32", VT::Float32, u32(std::bit_cast<std::uint32_t>(1e-5f))),
      kv("bool", VT::Bool, "\x01"),
      kv("str", VT::String, gstr("ünïcode \"quoted\"\n")),
      kv("u64", VT::Uint64, u64(UINT64_MAX)),
      kv("i64", VT::Int64, u64(static_cast<std::uint64_t>(INT64_MIN))),
      kv("f64", VT::Float64, u64(std::bit_cast<std::uint64_t>(-2.5e300))),
      kv("arr.i16", VT::Array,
         array_payload(VT::Int16, 3, std::string("\x01\x00\xff\xff\x00\x80", 6))),
      kv("arr.str", VT::Array, array_payload(VT::String, 3, gstr("a") + gstr("") + gstr("<s>"))),
      kv("arr.bool", VT::Array, array_payload(VT::Bool, 2, std::string("\x00\x01", 2))),
      kv("arr.empty", VT::Array, array_payload(VT::Float32, 0, "")),
      kv("arr.nested", VT::Array,
         array_payload(
             VT::Array, 2,
             array_payload(VT::Uint8, 2, "\x01\x02") + array_payload(VT::String, 1, gstr("x")))),
  };
  const auto h = read(f);
  EXPECT_EQ(h.version, 2u);
  EXPECT_EQ(h.alignment, 32u);
  EXPECT_TRUE(h.tensors.empty());
  ASSERT_EQ(h.metadata.size(), f.kvs.size());
  std::map<std::string, std::string> text;
  for (const auto& m : h.metadata) text[m.key] = gguf_value_text(m.value);
  EXPECT_EQ(text, (std::map<std::string, std::string>{{"u8", "255"},
                                                      {"i8", "-128"},
                                                      {"u16", "48879"},
                                                      {"i16", "-32768"},
                                                      {"u32", "4000000000"},
                                                      {"i32", "-7"},
                                                      {"f32", "1e-05"},
                                                      {"bool", "true"},
                                                      {"str", "ünïcode \"quoted\"\n"},
                                                      {"u64", "18446744073709551615"},
                                                      {"i64", "-9223372036854775808"},
                                                      {"f64", "-2.5e+300"},
                                                      {"arr.i16", "[3 items of INT16]"},
                                                      {"arr.str", "[3 items of STRING]"},
                                                      {"arr.bool", "[2 items of BOOL]"},
                                                      {"arr.empty", "[0 items of FLOAT32]"},
                                                      {"arr.nested", "[2 items of ARRAY]"}}));
  EXPECT_EQ(h.metadata[0].key, "u8");  // file order
  EXPECT_EQ(std::get<double>(h.metadata[6].value.value), double{1e-5f});

  // The JSON keeps every type and every value exactly.
  const auto json = nlohmann::json::parse(gguf_metadata_json(h.metadata));
  EXPECT_EQ(json["u64"], (nlohmann::json{{"type", "UINT64"}, {"value", UINT64_MAX}}));
  EXPECT_EQ(json["i64"]["value"].get<std::int64_t>(), INT64_MIN);
  EXPECT_EQ(json["f32"]["value"].get<double>(), 1e-05);
  EXPECT_EQ(json["str"]["value"], "ünïcode \"quoted\"\n");
  EXPECT_EQ(
      json["arr.i16"],
      (nlohmann::json{{"type", "ARRAY"}, {"element_type", "INT16"}, {"value", {1, -1, -32768}}}));
  EXPECT_EQ(json["arr.str"]["value"], (nlohmann::json{"a", "", "<s>"}));
  EXPECT_EQ(json["arr.bool"]["value"], (nlohmann::json{false, true}));
  EXPECT_EQ(json["arr.empty"]["value"], nlohmann::json::array());
  EXPECT_EQ(json["arr.nested"]["value"][0],
            (nlohmann::json{{"type", "ARRAY"}, {"element_type", "UINT8"}, {"value", {1, 2}}}));
  EXPECT_EQ(json["arr.nested"]["value"][1]["value"], (nlohmann::json{"x"}));
}

TEST_F(GgufTest, JsonOfOddValuesStaysValid) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  test::GgufBytes f;
  f.kvs = {kv("nan", VT::Float32, u32(std::bit_cast<std::uint32_t>(nan))),
           kv("inf", VT::Float64, u64(std::bit_cast<std::uint64_t>(-HUGE_VAL))),
           kv("bad.utf8", VT::String, gstr("a\xff\xc0\x80z")),
           kv("ctl", VT::String, gstr(std::string("\0\x1f", 2)))};
  const auto json = nlohmann::json::parse(gguf_metadata_json(read(f).metadata));
  EXPECT_EQ(json["nan"]["value"], "nan");
  EXPECT_EQ(json["inf"]["value"], "-inf");
  EXPECT_EQ(json["bad.utf8"]["value"], "a\uFFFD\uFFFD\uFFFDz");
  EXPECT_EQ(json["ctl"]["value"], std::string("\0\x1f", 2));
}

TEST_F(GgufTest, PlainTensorsGetTheirDTypeAndRowMajorShape) {
  test::GgufBytes f;
  f.tensors = {tensor_info("f32", {4, 3}, kF32, 0), tensor_info("bf16", {5}, kBF16, 64),
               tensor_info("scalar", {}, 28 /* F64 */, 96),
               tensor_info("empty", {0, 7}, kF16, 128)};
  f.data.assign(128, '\0');
  const auto h = read(f);
  ASSERT_EQ(h.tensors.size(), 4u);
  const auto& t = h.tensors;  // sorted by offset
  EXPECT_EQ(t[0].dtype, DType::F32);
  EXPECT_EQ(t[0].shape, (std::vector<std::uint64_t>{3, 4}));
  EXPECT_EQ(t[0].ggml_dims, (std::vector<std::uint64_t>{4, 3}));
  EXPECT_EQ(t[0].ggml_type, 0);
  EXPECT_EQ(t[0].size, 48u);
  EXPECT_EQ(t[0].offset, h.data_start);
  EXPECT_EQ(t[1].dtype, DType::BF16);
  EXPECT_EQ(t[1].size, 10u);
  EXPECT_EQ(t[1].offset, h.data_start + 64);
  EXPECT_TRUE(t[2].shape.empty());
  EXPECT_EQ(t[2].size, 8u);
  EXPECT_EQ(t[3].shape, (std::vector<std::uint64_t>{7, 0}));
  EXPECT_EQ(t[3].size, 0u);
  EXPECT_EQ(h.data_start % 32, 0u);
}

TEST_F(GgufTest, EveryQuantizedTypeIsRowsOfBytes) {
  // Two rows of two blocks, 3 matrices deep: shape [3, 2, 2 * type_size].
  test::GgufBytes f;
  std::uint64_t offset = 0;
  for (const auto& c : kAllTypes) {
    f.tensors.push_back(tensor_info(c.name, {2ull * c.block, 2, 3}, c.id, offset));
    offset += (12ull * c.bytes + 31) / 32 * 32;
  }
  f.data.assign(offset, '\0');
  const auto h = read(f);
  ASSERT_EQ(h.tensors.size(), std::size(kAllTypes));
  for (std::size_t i = 0; i < h.tensors.size(); ++i) {
    const auto& t = h.tensors[i];
    const auto& c = kAllTypes[i];
    SCOPED_TRACE(c.name);
    EXPECT_EQ(t.name, c.name);
    EXPECT_EQ(t.size, 12ull * c.bytes);
    EXPECT_EQ(t.ggml_type, static_cast<std::int32_t>(c.id));
    EXPECT_EQ(t.ggml_dims, (std::vector<std::uint64_t>{2ull * c.block, 2, 3}));
    if (c.block == 1) {
      EXPECT_EQ(t.shape, (std::vector<std::uint64_t>{3, 2, 2}));
    } else {
      EXPECT_EQ(t.dtype, DType::U8);
      EXPECT_EQ(t.shape, (std::vector<std::uint64_t>{3, 2, 2ull * c.bytes}));
    }
  }
}

TEST_F(GgufTest, CustomAlignment) {
  for (std::uint32_t alignment : {1u, 8u, 64u, 4096u}) {
    SCOPED_TRACE(alignment);
    auto f = one_tensor({32, 2}, kQ8_0, 2 * alignment + 68, 2 * alignment);
    f.kvs.push_back(kv("general.alignment", VT::Uint32, u32(alignment)));
    f.alignment = alignment;
    const auto h = read(f);
    EXPECT_EQ(h.alignment, alignment);
    EXPECT_EQ(h.data_start % alignment, 0u);
    EXPECT_EQ(h.data_start, f.build().size() - f.data.size());
    EXPECT_EQ(h.tensors[0].offset, h.data_start + 2 * alignment);
    EXPECT_EQ(h.tensors[0].size, 68u);
  }
}

TEST_F(GgufTest, TokenizerSizedHeaderIsReadInGrowingPieces) {
  // ~3 MB of strings: more than the first read, so the reader must fetch more of the file.
  std::string tokens;
  const std::uint64_t count = 200000;
  for (std::uint64_t i = 0; i < count; ++i) tokens += gstr("token_" + std::to_string(i));
  auto f = one_tensor({8}, kF32, 32);
  f.kvs.push_back(kv("tokenizer.ggml.tokens", VT::Array, array_payload(VT::String, count, tokens)));
  const auto h = read(f);
  const auto& array = std::get<GgufArray>(h.metadata.back().value.value);
  ASSERT_EQ(array.strings.size(), count);
  EXPECT_EQ(array.strings.back(), "token_199999");
  EXPECT_EQ(h.tensors[0].offset, f.build().size() - 32);
}

TEST_F(GgufTest, InMemoryPrefixMustHoldTheHeader) {
  const std::string bytes = one_tensor({4}, kF32, 16).build();
  const auto span = std::as_bytes(std::span(bytes.data(), bytes.size()));
  EXPECT_EQ(parse_gguf_header(span, bytes.size(), "mem").tensors.size(), 1u);
  EXPECT_TRUE(has_gguf_magic(span));
  try {
    parse_gguf_header(span.first(30), bytes.size(), "mem");
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_THAT(e.what(), HasSubstr("mem: the header needs"));
  }
}

// ---------------------------------------------------------------------------------------------
// Malformed files: the frame

TEST_F(GgufTest, NulInsideATensorName) {
  test::GgufBytes f;
  f.tensors.push_back(tensor_info("a", {4}, kF32, 0));
  f.tensors.push_back(tensor_info(std::string("a\0b", 3), {4}, kF32, 32));
  f.data.assign(64, '\x5a');
  expect_error(f, {"tensor \"a\\0...\"", "NUL"});
}

TEST_F(GgufTest, BadMagic) {
  auto f = one_tensor({4}, kF32, 16);
  f.magic = "GGUG";
  expect_error(f, {"bad magic"});
  expect_error("GG", {"too short"});
  expect_error("", {"too short"});
}

TEST_F(GgufTest, UnknownVersions) {
  auto f = one_tensor({4}, kF32, 16);
  f.version = 1;
  expect_error(f, {"version 1 is not supported"});
  f.version = 4;
  expect_error(f, {"unknown GGUF version 4"});
  f.version = 0;
  expect_error(f, {"unknown GGUF version 0"});
  f.version = 0x03000000;
  expect_error(f, {"big-endian"});
}

TEST_F(GgufTest, TensorCountPastTheEnd) {
  auto f = one_tensor({4}, kF32, 16);
  f.tensor_count = 2;  // the second tensor info is read from the padding: an empty name
  expect_error(f, {"tensor 1 of 2"});
  f.tensor_count = 100;
  expect_error(f, {"tensor count 100 cannot fit"});
  f.tensor_count = UINT64_MAX;
  expect_error(f, {"tensor count 18446744073709551615 cannot fit"});
}

TEST_F(GgufTest, KeyValueCountHuge) {
  auto f = one_tensor({4}, kF32, 16);
  f.kv_count = UINT64_MAX / 2;
  expect_error(f, {"key-value count", "cannot fit"});
  f.kv_count = 2;  // reads the tensor info as a pair; no room is left for the tensor
  expect_error(f.header(), {"tensor count 1 cannot fit"});
}

TEST_F(GgufTest, TruncatedAnywhereIsAFormatError) {
  auto f = one_tensor({4, 2}, kF32, 32);
  f.kvs.push_back(kv("arr", VT::Array, array_payload(VT::String, 2, gstr("ab") + gstr("c"))));
  const std::string whole = f.build();
  for (std::size_t n = 0; n < whole.size(); ++n) {
    SCOPED_TRACE(n);
    const auto path = write(whole.substr(0, n), "cut.gguf");
    try {
      read_gguf_header(path);
      ADD_FAILURE() << "accepted a file cut to " << n << " bytes";
    } catch (const FormatError& e) {
      EXPECT_THAT(e.what(), HasSubstr(path.string()));
    }
  }
}

TEST_F(GgufTest, HeaderLimit) {
  // A string claiming 300 MiB in a sparse file of 400 MiB: within the file, past the limit.
  auto f = one_tensor({4}, kF32, 16);
  f.kvs.push_back(kv("big", VT::String, u64(300ull << 20)));
  const auto path = write(f.header(), "sparse.gguf");
  fs::resize_file(path, 400ull << 20);
  try {
    read_gguf_header(path);
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_THAT(e.what(), HasSubstr("limit on GGUF headers"));
  }
}

// ---------------------------------------------------------------------------------------------
// Malformed files: metadata

TEST_F(GgufTest, StringLengthPastTheEnd) {
  test::GgufBytes f;
  f.kvs.push_back(kv("name", VT::String, u64(1000) + "short"));
  expect_error(f, {"key \"name\"", "1000 bytes", "past the end"});
  test::GgufBytes k;
  k.kvs.push_back(u64(UINT64_MAX) + "key");
  expect_error(k, {"key-value pair 0 of 1", "past the end"});
}

TEST_F(GgufTest, HugeArrayLengths) {
  for (VT element : {VT::Uint32, VT::String, VT::Array, VT::Bool}) {
    SCOPED_TRACE(gguf_value_type_name(element));
    test::GgufBytes f;
    f.kvs.push_back(kv("arr", VT::Array, array_payload(element, 1ull << 62, "")));
    expect_error(f, {"key \"arr\"", "array length 4611686018427387904 cannot fit"});
  }
}

TEST_F(GgufTest, NestedArraysTooDeep) {
  std::string payload = array_payload(VT::Uint8, 0, "");
  for (int i = 1; i < kGgufMaxArrayDepth; ++i) payload = array_payload(VT::Array, 1, payload);
  test::GgufBytes ok;
  ok.kvs.push_back(kv("deep", VT::Array, payload));
  EXPECT_EQ(read(ok).metadata.size(), 1u);
  test::GgufBytes f;
  f.kvs.push_back(kv("deep", VT::Array, array_payload(VT::Array, 1, payload)));
  expect_error(f, {"key \"deep\"", "nest deeper than 8"});
}

TEST_F(GgufTest, TooManyNestedArrays) {
  test::GgufBytes f;
  f.kvs.push_back(kv("many", VT::Array, array_payload(VT::Array, (1u << 20) + 1, "")));
  const auto path = write(f.header(), "many.gguf");
  fs::resize_file(path, 16u << 20);  // room for them all, as zeros
  try {
    read_gguf_header(path);
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_THAT(e.what(), HasSubstr("arrays of arrays hold more than"));
  }
}

TEST_F(GgufTest, UnknownValueTypes) {
  test::GgufBytes f;
  f.kvs.push_back(gstr("k") + u32(13) + u32(0));
  expect_error(f, {"key \"k\"", "unknown value type 13"});
  test::GgufBytes a;
  a.kvs.push_back(kv("k", VT::Array, u32(0x7fffffff) + u64(1)));
  expect_error(a, {"key \"k\"", "unknown array element type 2147483647"});
}

TEST_F(GgufTest, BoolMustBeZeroOrOne) {
  test::GgufBytes f;
  f.kvs.push_back(kv("b", VT::Bool, "\x02"));
  expect_error(f, {"key \"b\"", "is 2, not 0 or 1"});
  test::GgufBytes a;
  a.kvs.push_back(kv("b", VT::Array, array_payload(VT::Bool, 2, std::string("\x01\xff", 2))));
  expect_error(a, {"key \"b\"", "element 1 is 255"});
}

TEST_F(GgufTest, DuplicateAndEmptyKeys) {
  test::GgufBytes f;
  f.kvs = {kv("a", VT::Uint8, "\x01"), kv("a", VT::String, gstr("x"))};
  expect_error(f, {"key \"a\"", "appears twice"});
  f.kvs = {kv("", VT::Uint8, "\x01")};
  expect_error(f, {"empty key"});
}

TEST_F(GgufTest, AlignmentMustBeAUint32PowerOfTwo) {
  for (std::uint32_t bad : {0u, 3u, 48u, 0xFFFFFFFFu}) {
    SCOPED_TRACE(bad);
    auto f = one_tensor({4}, kF32, 16);
    f.kvs.push_back(kv("general.alignment", VT::Uint32, u32(bad)));
    expect_error(f, {"general.alignment", std::to_string(bad), "not a nonzero power of two"});
  }
  auto f = one_tensor({4}, kF32, 16);
  f.kvs.push_back(kv("general.alignment", VT::Uint64, u64(32)));
  expect_error(f, {"general.alignment", "must be a UINT32, not UINT64"});
}

// ---------------------------------------------------------------------------------------------
// Malformed files: tensor infos

TEST_F(GgufTest, TooManyDimensions) {
  expect_error(one_tensor({1, 1, 1, 1, 4}, kF32, 16), {"tensor \"w\"", "n_dims is 5"});
}

TEST_F(GgufTest, DimensionProductOverflows) {
  expect_error(one_tensor({1ull << 32, 1ull << 32}, kF32, 16),
               {"tensor \"w\"", "[4294967296, 4294967296]", "more than 2^63 - 1 elements"});
  expect_error(one_tensor({1ull << 63}, kF32, 16), {"tensor \"w\"", "dimension 0 is"});
  // Empty, but a shape whose product overflows before it meets the zero.
  expect_error(one_tensor({0, 1ull << 32, 1ull << 32}, kF32, 16), {"2^63 - 1 elements"});
  // 2^62 elements fit int64; their 2^65 bytes do not fit 64 bits.
  expect_error(one_tensor({1ull << 62}, 28 /* F64 */, 16), {"tensor \"w\"", "2^64 bytes"});
}

TEST_F(GgufTest, UnknownGgmlTypes) {
  for (std::uint32_t id : {4u, 5u, 31u, 36u, 42u, 99u}) {
    SCOPED_TRACE(id);
    expect_error(one_tensor({32}, id, 32),
                 {"tensor \"w\"", "unknown ggml type " + std::to_string(id)});
  }
}

TEST_F(GgufTest, RowNotAMultipleOfTheBlock) {
  expect_error(one_tensor({33, 2}, kQ4_0, 64),
               {"tensor \"w\"", "ne[0] = 33 of Q4_0", "not a multiple of its block size 32"});
  expect_error(one_tensor({128}, kQ4_K, 144), {"ne[0] = 128 of Q4_K", "block size 256"});
  expect_error(one_tensor({}, kQ8_0, 34), {"ne[0] = 1 of Q8_0"});
}

TEST_F(GgufTest, EmptyTensorBeyondTheEndOfTheFile) {
  auto f = one_tensor({0}, kF32, 0);
  f.kvs.push_back(kv("general.alignment", VT::Uint32, u32(4096)));
  expect_error(f.header(), {"data section starts at 4096, past the end"});
}

TEST_F(GgufTest, TensorOffsetOutOfBounds) {
  expect_error(one_tensor({4}, kF32, 15), {"tensor \"w\"", "run past the 15 data bytes"});
  expect_error(one_tensor({4}, kF32, 16, 32), {"tensor \"w\"", "16 bytes at offset 32"});
  expect_error(one_tensor({4}, kF32, 16, UINT64_MAX - 31), {"tensor \"w\"", "run past"});
}

TEST_F(GgufTest, MisalignedOffset) {
  expect_error(one_tensor({4}, kF32, 64, 16),
               {"tensor \"w\"", "offset 16 is not a multiple of the alignment 32"});
}

TEST_F(GgufTest, OverlappingTensors) {
  auto f = one_tensor({64}, kF32, 256);
  f.tensors.push_back(tensor_info("v", {8}, kF32, 224));
  expect_error(f, {"\"w\"", "\"v\"", "overlap"});
  f.tensors.back() = tensor_info("v", {4}, kF32, 0);
  expect_error(f, {"overlap"});
}

TEST_F(GgufTest, DuplicateAndEmptyTensorNames) {
  auto f = one_tensor({4}, kF32, 64);
  f.tensors.push_back(tensor_info("w", {4}, kF32, 32));
  expect_error(f, {"tensor \"w\" appears twice"});
  f.tensors.back() = tensor_info("", {4}, kF32, 32);
  expect_error(f, {"tensor 1 of 2", "empty name"});
}

}  // namespace
}  // namespace ferry
