// Per-key reads: byte ranges of one tensor equal the file's bytes (checked against the plain
// host path), the files are held from construction (a renamed-over path does not change what is
// read), and a file truncated underneath or a range outside the tensor is a clear error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <vector>

#include "ferry/checkpoint.hpp"
#include "ferry/error.hpp"
#include "ferry/tensor_reader.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST(TensorReader, RangesEqualThePlainHostPath) {
  test::TempDir dir;
  const auto path = dir / "m.safetensors";
  test::write_random_checkpoint(
      path, {{"a", DType::F32, {300, 7}}, {"b", DType::BF16, {3}}, {"e", DType::I64, {0}}}, 5);
  const auto checkpoint = Checkpoint::open_shared(path);
  const TensorReader reader(checkpoint);
  for (const auto& t : checkpoint->tensors()) {
    const auto plain = test::read_plain(*checkpoint, t);
    std::vector<std::byte> whole(t.size);
    reader.read(t, 0, t.size, whole.data());
    EXPECT_EQ(whole, plain) << t.name;
    if (t.size < 10) continue;
    std::vector<std::byte> part(t.size / 3);
    reader.read(t, 5, part.size(), part.data());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), plain.begin() + 5)) << t.name;
  }
}

TEST(TensorReader, RangeOutsideTheTensorIsRefused) {
  test::TempDir dir;
  const auto path = dir / "m.safetensors";
  test::write_random_checkpoint(path, {{"a", DType::U8, {16}}}, 1);
  const auto checkpoint = Checkpoint::open_shared(path);
  const TensorReader reader(checkpoint);
  std::vector<std::byte> buffer(32);
  EXPECT_THROW(reader.read(*checkpoint->find("a"), 8, 9, buffer.data()), std::out_of_range);
  EXPECT_THROW(reader.read(*checkpoint->find("a"), 17, 0, buffer.data()), std::out_of_range);
}

TEST(TensorReader, HoldsTheFileItOpened) {
  test::TempDir dir;
  const auto path = dir / "m.safetensors";
  const auto first = test::write_random_checkpoint(path, {{"a", DType::U8, {4096}}}, 1);
  const auto checkpoint = Checkpoint::open_shared(path);
  const TensorReader reader(checkpoint);
  // A new file renamed over the path, as save_file, downloads and git checkouts do.
  test::write_random_checkpoint(dir / "new.safetensors", {{"a", DType::U8, {4096}}}, 2);
  std::error_code refused;
  fs::rename(dir / "new.safetensors", path, refused);
#ifdef _WIN32
  // Windows (and Wine) refuse to replace a file that is open: the reader can only keep it.
  if (refused) GTEST_SKIP() << "the system refuses to rename over an open file: " << refused;
#endif
  ASSERT_FALSE(refused) << refused.message();
  std::vector<std::byte> got(4096);
  reader.read(*checkpoint->find("a"), 0, got.size(), got.data());
  EXPECT_EQ(got, first.at("a"));
  fs::remove(path);
  reader.read(*checkpoint->find("a"), 0, got.size(), got.data());
  EXPECT_EQ(got, first.at("a"));
}

TEST(TensorReader, FileTruncatedUnderneathIsAClearError) {
  test::TempDir dir;
  const auto path = dir / "m.safetensors";
  test::write_random_checkpoint(path, {{"a", DType::U8, {4096}}}, 1);
  const auto checkpoint = Checkpoint::open_shared(path);
  const TensorReader reader(checkpoint);
  fs::resize_file(path, fs::file_size(path) - 100);
  std::vector<std::byte> got(4096);
  try {
    reader.read(*checkpoint->find("a"), 0, got.size(), got.data());
    ADD_FAILURE() << "no error for a truncated file";
  } catch (const FormatError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path.string()));
    EXPECT_THAT(e.what(), HasSubstr("truncated"));
  }
  // A reader made after the file changed refuses it at once.
  EXPECT_THROW(TensorReader{checkpoint}, FormatError);
}

}  // namespace
}  // namespace ferry
