// The staged engine with host destinations, checked byte for byte against the plain host path.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

#include "ferry/error.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "io/source_file.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

using test::TempDir;

// Odd sizes put most tensors at offsets that are not 4 KiB (or even 2-byte) aligned.
std::vector<TensorSpec> odd_specs() {
  std::vector<TensorSpec> specs;
  const std::uint64_t sizes[] = {3, 4096, 1, 70001, 255, 1 << 20, 12345, 8, (3 << 20) + 7, 999};
  for (std::size_t i = 0; i < std::size(sizes); ++i)
    specs.push_back({"w" + std::to_string(i), DType::U8, {sizes[i]}});
  return specs;
}

bool direct_io_works(const std::filesystem::path& file) {
  int fd = ::open(file.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return false;
  void* buffer = nullptr;
  bool ok = ::posix_memalign(&buffer, 4096, 4096) == 0 && ::pread(fd, buffer, 4096, 0) >= 0;
  std::free(buffer);
  ::close(fd);
  return ok;
}

void expect_equal_to_plain(const LoadedCheckpoint& loaded) {
  for (const auto& t : loaded.tensors()) {
    auto plain = test::read_plain(loaded.checkpoint(), *t.info);
    ASSERT_EQ(std::memcmp(t.data, plain.data(), plain.size()), 0) << t.info->name;
  }
}

struct EngineCase {
  IoMode io;
  std::uint64_t chunk_bytes;
  unsigned threads;
  std::uint64_t staging_bytes;
};

class EngineMatrix : public ::testing::TestWithParam<EngineCase> {};

TEST_P(EngineMatrix, LandsEveryByteExactlyAsThePlainPath) {
  const EngineCase c = GetParam();
  TempDir dir;
  const auto file = dir / "m.safetensors";
  auto written = test::write_random_checkpoint(file, odd_specs(), 11);
  if (c.io == IoMode::Direct && !direct_io_works(file)) GTEST_SKIP() << "no O_DIRECT here";
  auto ckpt = Checkpoint::open_shared(file);
  LoadOptions options;
  options.io = c.io;
  options.chunk_bytes = c.chunk_bytes;
  options.reader_threads = c.threads;
  options.staging_bytes = c.staging_bytes;
  auto loaded = load(ckpt, options);
  ASSERT_EQ(loaded.tensors().size(), written.size());
  expect_equal_to_plain(loaded);
  for (const auto& t : loaded.tensors()) {
    const auto& bytes = written.at(t.info->name);
    EXPECT_EQ(std::memcmp(t.data, bytes.data(), bytes.size()), 0) << t.info->name;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data) % 256, 0u);
  }
  const auto& stats = loaded.stats();
  EXPECT_EQ(stats.device, "cpu");
  EXPECT_EQ(stats.tensor_bytes, ckpt->total_bytes());
  EXPECT_GE(stats.bytes_read, stats.tensor_bytes);
  ASSERT_EQ(stats.files.size(), 1u);
  EXPECT_FALSE(stats.files[0].reason.empty());
  if (c.io != IoMode::Auto) {
    EXPECT_EQ(stats.files[0].io_path, c.io == IoMode::Direct ? IoPath::Direct : IoPath::Buffered);
  }
  EXPECT_LE(stats.staging_bytes, c.staging_bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Configurations, EngineMatrix,
    ::testing::Values(EngineCase{IoMode::Buffered, 0, 0, 256 << 20},
                      EngineCase{IoMode::Buffered, 4096, 1, 1 << 20},
                      EngineCase{IoMode::Buffered, 64 << 10, 3, 1 << 20},
                      EngineCase{IoMode::Direct, 0, 0, 256 << 20},
                      EngineCase{IoMode::Direct, 4096, 2, 1 << 20},
                      EngineCase{IoMode::Direct, 100000, 3, 4 << 20},
                      EngineCase{IoMode::Auto, 1 << 20, 4, 16 << 20}));

// The statistics' timeline: every stage reached, in order, within the load's own time.
void expect_ordered_timeline(const LoadStats& stats) {
  const PipelineTimes& p = stats.pipeline;
  EXPECT_GT(p.first_read, 0.0);
  EXPECT_LE(p.first_read, p.last_read);
  if (p.last_copy > 0) {                    // some group went through staging
    EXPECT_GE(p.first_copy, p.first_read);  // a copy leaves a slot after its read
    EXPECT_LE(p.first_copy, p.last_copy);
    EXPECT_LE(p.last_copy, p.copies_done);
  }
  EXPECT_LE(p.last_read, p.copies_done);
  EXPECT_LE(p.copies_done, p.done);
  EXPECT_GT(stats.submit_seconds, 0.0);
  EXPECT_LE(stats.submit_seconds + p.done, stats.seconds);
  EXPECT_GT(p.first_job, 0.0);
  EXPECT_LE(p.first_job, p.last_job);
  EXPECT_LE(p.first_job, p.first_read);  // a worker runs before it reads
  EXPECT_GE(p.staging_ready, p.first_job);
  EXPECT_GE(p.streams_ready, p.staging_ready);
  EXPECT_LE(p.streams_ready, p.done);  // a worker with no group left may start after the copies
  // The same phases on the load's clock, in order, from planning to the end.
  const auto& t = stats.timeline;
  ASSERT_GE(t.size(), 6u);
  EXPECT_EQ(t[0].first, "planned");
  EXPECT_EQ(t[1].first, "allocated");
  EXPECT_EQ(t[2].first, "submitted");
  EXPECT_EQ(t.back().first, "done");
  EXPECT_DOUBLE_EQ(t.back().second, stats.seconds);
  for (std::size_t i = 1; i < t.size(); ++i) EXPECT_LE(t[i - 1].second, t[i].second) << t[i].first;
  const auto at = [&](const std::string& name) {
    for (const auto& [n, seconds] : t)
      if (n == name) return seconds;
    ADD_FAILURE() << "no " << name << " in the timeline";
    return -1.0;
  };
  EXPECT_DOUBLE_EQ(at("first_read"), stats.submit_seconds + p.first_read);
  EXPECT_LE(at("first_worker"), at("first_read"));
  EXPECT_LE(at("staging_ready"), at("submission_done"));
  EXPECT_LE(at("streams_ready"), at("submission_done"));
  EXPECT_EQ(stats.pipeline.page_cache_leased, 0.0);  // page-cache DMA is off
  // And in the JSON every front end reads.
  const std::string json = to_json(stats);
  EXPECT_NE(json.find("\"timeline\":[[\"planned\","), std::string::npos) << json;
  EXPECT_NE(json.find("\"staging_ready\""), std::string::npos);
}

TEST(Engine, StatisticsSayWhenEachStageOfTheLoadWasReached) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  test::write_random_checkpoint(file, odd_specs(), 12);
  auto ckpt = Checkpoint::open_shared(file);
  for (std::uint64_t chunk : {std::uint64_t{0}, std::uint64_t{64 << 10}}) {
    LoadOptions options;
    options.io = IoMode::Buffered;
    options.chunk_bytes = chunk;
    options.profile = true;  // no GPU copies: nothing to time, no error
    auto loaded = load(ckpt, options);
    expect_equal_to_plain(loaded);
    expect_ordered_timeline(loaded.stats());
    // Reads of several tensors go through staging (memcpy copies out of the slot).
    if (chunk == 0) {
      EXPECT_GT(loaded.stats().pipeline.first_copy, 0.0);
    }
    EXPECT_EQ(loaded.stats().pipeline.copy_groups, 0u);
    EXPECT_EQ(loaded.stats().pipeline.copy_busy, 0.0);
  }
}

// A started load hands out its final addresses at once; its bytes are there once wait() returns.
TEST(Engine, StartedLoadGivesItsAddressesFirstAndItsBytesAfterTheWait) {
  TempDir dir;
  auto written = test::write_random_checkpoint(dir / "m.safetensors", odd_specs(), 13);
  auto ckpt = Checkpoint::open_shared(dir / "m.safetensors");
  LoadOptions options;
  options.chunk_bytes = 64 << 10;
  PendingLoad pending = start_load(ckpt, options);
  std::vector<void*> addresses;
  for (const auto& t : pending.loaded().tensors()) addresses.push_back(t.data);
  ASSERT_EQ(addresses.size(), written.size());
  LoadedCheckpoint loaded = pending.wait();
  ASSERT_EQ(loaded.tensors().size(), addresses.size());
  for (std::size_t i = 0; i < addresses.size(); ++i)
    EXPECT_EQ(loaded.tensors()[i].data, addresses[i]) << loaded.tensors()[i].info->name;
  expect_equal_to_plain(loaded);
  EXPECT_THROW(pending.wait(), std::logic_error);
}

// A started load dropped without a wait is cancelled; its copies stop before its memory goes
// (ASan and TSan would see a copy into freed memory), and the engine serves the next load.
TEST(Engine, StartedLoadDroppedWithoutAWaitStopsBeforeItsMemoryGoes) {
  TempDir dir;
  auto written = test::write_random_checkpoint(dir / "m.safetensors", odd_specs(), 14);
  auto ckpt = Checkpoint::open_shared(dir / "m.safetensors");
  LoadOptions options;
  options.chunk_bytes = 4096;
  options.reader_threads = 2;
  for (int i = 0; i < 5; ++i) (void)start_load(ckpt, options);
  expect_equal_to_plain(load(ckpt, options));
}

TEST(Engine, LoadsASubsetOnly) {
  TempDir dir;
  auto written = test::write_random_checkpoint(dir / "m.safetensors", odd_specs(), 12);
  auto ckpt = Checkpoint::open_shared(dir / "m.safetensors");
  LoadOptions options;
  options.names = {"w3", "w7", "w0"};
  auto loaded = load(ckpt, options);
  ASSERT_EQ(loaded.tensors().size(), 3u);
  EXPECT_EQ(loaded.find("w1"), nullptr);
  for (const auto* name : {"w0", "w3", "w7"}) {
    const LoadedTensor* t = loaded.find(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(std::memcmp(t->data, written.at(name).data(), t->info->size), 0);
  }
  EXPECT_EQ(loaded.stats().tensor_bytes, 3u + 70001 + 8);
}

TEST(Engine, MemoryOutlivesTheLoadedCheckpointWhileReferenced) {
  TempDir dir;
  auto written = test::write_random_checkpoint(dir / "m.safetensors", odd_specs(), 13);
  std::shared_ptr<void> memory;
  const void* data = nullptr;
  {
    auto loaded = load(Checkpoint::open_shared(dir / "m.safetensors"),
                       LoadOptions{});
    memory = loaded.memory();
    data = loaded.find("w5")->data;
  }
  EXPECT_EQ(std::memcmp(data, written.at("w5").data(), 1 << 20), 0);
  EXPECT_EQ(memory.use_count(), 1);
}

TEST(Engine, LoadIntoCallerMemory) {
  TempDir dir;
  auto written = test::write_random_checkpoint(dir / "m.safetensors", odd_specs(), 14);
  auto ckpt = Checkpoint::open(dir / "m.safetensors");
  std::vector<std::byte> a(70001), b(999 + 5);
  std::vector<TensorDestination> dst = {{"w3", a.data(), a.size()}, {"w9", b.data(), b.size()}};
  LoadOptions options;
  options.chunk_bytes = 4096;
  auto stats = load_into(ckpt, dst, options);
  EXPECT_EQ(stats.tensor_bytes, 70001u + 999);
  EXPECT_EQ(std::memcmp(a.data(), written.at("w3").data(), a.size()), 0);
  EXPECT_EQ(std::memcmp(b.data(), written.at("w9").data(), 999), 0);
}

TEST(Engine, LoadIntoRejectsSmallOrDuplicateDestinations) {
  TempDir dir;
  test::write_random_checkpoint(dir / "m.safetensors", odd_specs(), 15);
  auto ckpt = Checkpoint::open(dir / "m.safetensors");
  std::vector<std::byte> small(10);
  std::vector<TensorDestination> too_small = {{"w3", small.data(), small.size()}};
  EXPECT_THROW(load_into(ckpt, too_small, LoadOptions{}), std::invalid_argument);
  std::vector<TensorDestination> twice = {{"w0", small.data(), 10}, {"w0", small.data(), 10}};
  EXPECT_THROW(load_into(ckpt, twice, LoadOptions{}), std::invalid_argument);
}

TEST(Engine, FileThatShrankAfterOpeningIsAnErrorNotGarbage) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  test::write_random_checkpoint(file, odd_specs(), 16);
  auto ckpt = Checkpoint::open_shared(file);
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 500);
  for (IoMode io : {IoMode::Buffered, IoMode::Auto}) {
    LoadOptions options;
    options.io = io;
    try {
      load(ckpt, options);
      FAIL() << "expected an error";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("end of file"), std::string::npos) << e.what();
    }
  }
}

TEST(Engine, ReportsProgressUpToTheTotal) {
  TempDir dir;
  test::write_random_checkpoint(dir / "m.safetensors", odd_specs(), 17);
  auto ckpt = Checkpoint::open_shared(dir / "m.safetensors");
  LoadOptions options;
  options.chunk_bytes = 64 << 10;
  std::uint64_t last = 0, total = 0, calls = 0;
  options.progress = [&](std::uint64_t done, std::uint64_t all) {
    EXPECT_GE(done, last);
    last = done;
    total = all;
    ++calls;
  };
  auto loaded = load(ckpt, options);
  EXPECT_GT(calls, 10u);
  EXPECT_EQ(last, total);
  EXPECT_EQ(total, loaded.stats().bytes_read);
}

TEST(Engine, RefusesStagingTooSmallForTwoChunks) {
  TempDir dir;
  test::write_random_checkpoint(dir / "m.safetensors", odd_specs(), 18);
  auto ckpt = Checkpoint::open_shared(dir / "m.safetensors");
  LoadOptions options;
  options.chunk_bytes = 1 << 20;
  options.staging_bytes = 1 << 20;
  EXPECT_THROW(load(ckpt, options), std::invalid_argument);
}

TEST(Engine, DirectOnAFileSystemThatRefusesItIsAClearErrorAndAutoSaysWhy) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  test::write_random_checkpoint(file, odd_specs(), 19);
  if (direct_io_works(file)) GTEST_SKIP() << "this file system supports O_DIRECT";
  auto ckpt = Checkpoint::open_shared(file);
  LoadOptions direct;
  direct.io = IoMode::Direct;
  EXPECT_THROW(load(ckpt, direct), std::invalid_argument);
  auto loaded = load(ckpt, LoadOptions{});
  EXPECT_EQ(loaded.stats().files[0].io_path, IoPath::Buffered);
}

// Every page asked for, as a reference for the sampled probe.
double exact_page_cache_fraction(const detail::FileDescriptor& fd, std::uint64_t size) {
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (map == MAP_FAILED) return -1;
  const std::uint64_t pages = (size + 4095) / 4096;
  std::vector<unsigned char> resident(pages);
  const int rc = ::mincore(map, size, resident.data());
  ::munmap(map, size);
  if (rc != 0) return -1;
  std::uint64_t in = 0;
  for (unsigned char r : resident) in += r & 1;
  return static_cast<double>(in) / static_cast<double>(pages);
}

// The residency probe behind auto's buffered-or-O_DIRECT choice samples large files; it must
// still see how much of a file the page cache holds.
TEST(PageCache, SampledResidencyFollowsWhatTheCacheHolds) {
  TempDir dir;
  const auto file = dir / "big.bin";
  const std::uint64_t size = 2 * detail::kResidencySamplePages * 4096 + 12345;
  test::write_file(file, std::string(size, 'x'));
  detail::FileDescriptor fd = detail::open_for_reading(file);
  ASSERT_EQ(::fdatasync(fd.get()), 0);
  ASSERT_EQ(::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED), 0);
  if (detail::page_cache_fraction(fd, size) > 0.05)
    GTEST_SKIP() << "this file system keeps pages in memory after POSIX_FADV_DONTNEED";
  // No read-ahead: pages still arriving between the two counts below would make them differ.
  ASSERT_EQ(::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_RANDOM), 0);
  std::vector<char> buffer(1 << 20);
  for (std::uint64_t at = 0; at < size / 2; at += buffer.size())
    ASSERT_GT(::pread(fd.get(), buffer.data(), buffer.size(), static_cast<off_t>(at)), 0);
  const double exact = exact_page_cache_fraction(fd, size);
  ASSERT_GT(exact, 0.45);
  ASSERT_LT(exact, 0.75);
  EXPECT_NEAR(detail::page_cache_fraction(fd, size), exact, 0.02);
  for (std::uint64_t at = size / 2; at < size; at += buffer.size())
    ASSERT_GT(::pread(fd.get(), buffer.data(), buffer.size(), static_cast<off_t>(at)), 0);
  EXPECT_GT(detail::page_cache_fraction(fd, size), 0.99);
}

TEST(PageCache, SmallFilesAreProbedPageByPage) {
  TempDir dir;
  const auto file = dir / "small.bin";
  test::write_file(file, std::string(3 * 4096 + 5, 'y'));
  detail::FileDescriptor fd = detail::open_for_reading(file);
  EXPECT_EQ(detail::page_cache_fraction(fd, 3 * 4096 + 5), 1.0);
  EXPECT_EQ(detail::page_cache_fraction(fd, 0), 1.0);
}

TEST(Engine, CudaWithoutAGpuIsACudaError) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present";
  TempDir dir;
  test::write_random_checkpoint(dir / "m.safetensors", odd_specs(), 20);
  auto ckpt = Checkpoint::open_shared(dir / "m.safetensors");
  LoadOptions options;
  options.device = Device::cuda(0);
  try {
    load(ckpt, options);
    FAIL() << "expected an error";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("no usable CUDA device"), std::string::npos);
  }
}

TEST(Device, ParsesAndRejects) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::cuda(3).to_string(), "cuda:3");
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:1x", "CPU"})
    EXPECT_THROW(Device::parse(bad), std::invalid_argument) << bad;
  EXPECT_EQ(parse_io_mode("direct"), IoMode::Direct);
  EXPECT_THROW(parse_io_mode("fast"), std::invalid_argument);
}

}  // namespace
}  // namespace ferry
