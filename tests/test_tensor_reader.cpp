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

TEST(TensorReader, StridedRangesEqualThePlainHostPath) {
  test::TempDir dir;
  const auto path = dir / "m.safetensors";
  test::write_random_checkpoint(path, {{"a", DType::F32, {64, 40}}}, 3);
  const auto checkpoint = Checkpoint::open_shared(path);
  const TensorReader reader(checkpoint);
  const TensorInfo& t = *checkpoint->find("a");
  const auto plain = test::read_plain(*checkpoint, t);
  // The second half of every row's columns (a 2-way column split), then two touching ranges.
  std::vector<TensorReader::Range> ranges;
  for (std::uint64_t row = 0; row < 64; ++row) ranges.push_back({row * 160 + 80, row * 160 + 160});
  ranges.push_back({0, 8});
  ranges.push_back({8, 24});
  std::vector<std::byte> want;
  for (const auto& r : ranges)
    want.insert(want.end(), plain.begin() + r.begin, plain.begin() + r.end);
  const std::uint64_t before = reader.bytes_read();
  std::vector<std::byte> got(want.size());
  reader.read_ranges(t, ranges, got.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(reader.bytes_read() - before, want.size());  // only the bytes asked for
  // The same ranges through the transfer engine.
  std::vector<std::byte> engine(want.size());
  reader.wait(reader.submit_ranges(t, ranges, engine.data(), Device::cpu()));
  EXPECT_EQ(engine, want);
  EXPECT_THROW(reader.submit_ranges(t, std::vector<TensorReader::Range>{{8, 4}}, engine.data(),
                                    Device::cpu()),
               std::out_of_range);
  const std::vector<TensorReader::Range> reversed = {{8, 4}};
  EXPECT_THROW(reader.read_ranges(t, reversed, got.data()), std::out_of_range);
  const std::vector<TensorReader::Range> outside = {{0, t.size + 1}};
  EXPECT_THROW(reader.read_ranges(t, outside, got.data()), std::out_of_range);
}

TEST(TensorReader, AFileJustWrittenIsReadThroughThePageCache) {
  // Its pages are resident: per-key readers take the small-read path for it.
  test::TempDir dir;
  const auto path = dir / "m.safetensors";
  test::write_random_checkpoint(path, {{"a", DType::F32, {1000}}}, 2);
  const auto checkpoint = Checkpoint::open_shared(path);
  const TensorReader reader(checkpoint);
#ifdef _WIN32
  // Windows cannot report residency (platform/windows/file_ranges.cpp): never the small path.
  EXPECT_FALSE(reader.through_page_cache(*checkpoint->find("a")));
#else
  EXPECT_TRUE(reader.through_page_cache(*checkpoint->find("a")));
#endif
}

TEST(TensorReader, SubmittedReadsEqualThePlainHostPath) {
  test::TempDir dir;
  const auto path = dir / "m.safetensors";
  // Large enough to be cut into several chunks read by several workers.
  test::write_random_checkpoint(path, {{"a", DType::U8, {9u << 20}}, {"b", DType::F32, {1000}}}, 4);
  const auto checkpoint = Checkpoint::open_shared(path);
  const TensorReader reader(checkpoint);
  for (const auto& t : checkpoint->tensors()) {
    const auto plain = test::read_plain(*checkpoint, t);
    std::vector<std::byte> got(t.size - 3);
    const std::uint64_t before = reader.bytes_read();
    const Ticket ticket = reader.submit(t, 3, got.size(), got.data(), Device::cpu());
    reader.wait(ticket);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), plain.begin() + 3)) << t.name;
    EXPECT_GE(reader.bytes_read() - before, got.size()) << t.name;
  }
  std::vector<std::byte> buffer(16);
  EXPECT_THROW(reader.submit(*checkpoint->find("b"), 3990, 16, buffer.data(), Device::cpu()),
               std::out_of_range);
}

TEST(TensorReader, TensorsSubmittedAsOneTicketEqualThePlainHostPath) {
  test::TempDir dir;
  const auto path = dir / "m.safetensors";
  // Many small tensors (a read-ahead window), one large enough for several chunks, one empty.
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 40; ++i)
    specs.push_back({"t" + std::to_string(100 + i), DType::F32, {64, 33 + std::uint64_t(i)}});
  specs.push_back({"big", DType::U8, {9u << 20}});
  specs.push_back({"empty", DType::F32, {0}});
  test::write_random_checkpoint(path, specs, 7);
  const auto checkpoint = Checkpoint::open_shared(path);
  const TensorReader reader(checkpoint);
  std::vector<std::vector<std::byte>> memory;
  std::vector<TensorReader::Whole> wanted;
  // In reverse file order, every other one: the ticket lands each tensor in its own memory.
  const auto& tensors = checkpoint->tensors();
  for (std::size_t i = tensors.size(); i-- > 0;) {
    if (i % 2 == 1 && tensors[i].size < (1u << 20) && tensors[i].size > 0) continue;
    memory.emplace_back(tensors[i].size + 1, std::byte{0x5a});  // one guard byte after each
    wanted.push_back({&tensors[i], memory.back().data()});
  }
  const std::uint64_t before = reader.bytes_read();
  const Ticket ticket = reader.submit_tensors(wanted, Device::cpu());
  std::uint64_t expected = 0;
  for (const auto& w : wanted) expected += w.tensor->size;
  EXPECT_EQ(ticket.extent_count(), wanted.size() - 1);  // the empty tensor needs no extent
  reader.wait(ticket);
  EXPECT_GE(reader.bytes_read() - before, expected);  // O_DIRECT may widen reads to pages
  for (std::size_t k = 0; k < wanted.size(); ++k) {
    const auto plain = test::read_plain(*checkpoint, *wanted[k].tensor);
    EXPECT_TRUE(std::equal(plain.begin(), plain.end(), memory[k].begin())) << wanted[k].tensor->name;
    EXPECT_EQ(memory[k].back(), std::byte{0x5a}) << wanted[k].tensor->name;
  }
  const std::vector<TensorReader::Whole> no_memory = {{checkpoint->find("big"), nullptr}};
  EXPECT_THROW(reader.submit_tensors(no_memory, Device::cpu()), std::invalid_argument);
}

TEST(TensorReader, SubmittedReadOfATruncatedFileIsAClearError) {
  test::TempDir dir;
  const auto path = dir / "m.safetensors";
  test::write_random_checkpoint(path, {{"a", DType::U8, {1u << 20}}}, 1);
  const auto checkpoint = Checkpoint::open_shared(path);
  const TensorReader reader(checkpoint);
  fs::resize_file(path, fs::file_size(path) - 4096);
  std::vector<std::byte> got(1u << 20);
  const Ticket ticket =
      reader.submit(*checkpoint->find("a"), 0, got.size(), got.data(), Device::cpu());
  try {
    reader.wait(ticket);
    ADD_FAILURE() << "no error for a truncated file";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr(path.string()));
  }
}

}  // namespace
}  // namespace ferry
