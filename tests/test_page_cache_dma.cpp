// Page-cache DMA through loads and transfers (TransferOptions::page_cache_pin_bytes), on the CPU:
// a host stand-in for the driver's registration that serves host memory, so the staged
// backend's copies from registered mappings are checked bit-exact against the plain host path,
// and every refusal is seen in the statistics.
#include <gtest/gtest.h>
#ifndef _WIN32
#include <fcntl.h>
#include <unistd.h>
#endif

#include <cstring>
#include <filesystem>
#include <string>

#include "ferry/load_preparation.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "ferry/transfer.hpp"
#include "platform/file_mapping.hpp"
#include "test_support.hpp"
#include "services/page_cache_registry.hpp"
#include "transfer/staged/staged_page_cache.hpp"

namespace ferry {
namespace {

using test::TempDir;

struct StandIn {
  int registered = 0;
  int unregistered = 0;
  detail::PageCacheRegistrar registrar() {
    detail::PageCacheRegistrar r;
    r.name = "host stand-in";
    r.serves = [](const Device& d) { return !d.is_cuda(); };
    r.register_range = [this](const std::byte*, std::uint64_t) { ++registered; };
    r.unregister_range = [this](const std::byte*) { ++unregistered; };
    return r;
  }
};

std::vector<TensorSpec> odd_specs() {
  std::vector<TensorSpec> specs;
  const std::uint64_t sizes[] = {3, 4096, 1, 70001, 255, 1 << 20, 12345, 8, (3 << 20) + 7, 999};
  for (std::size_t i = 0; i < std::size(sizes); ++i)
    specs.push_back({"w" + std::to_string(i), DType::U8, {sizes[i]}});
  return specs;
}

LoadOptions pinned_options(std::uint64_t budget) {
  LoadOptions o;
  o.page_cache_pin_bytes = budget;
  o.chunk_bytes = 1 << 20;  // several groups per file, on several workers
  return o;
}

void expect_plain_bytes(const Checkpoint& ckpt, const LoadedCheckpoint& loaded) {
  for (const auto& t : loaded.tensors()) {
    const auto plain = test::read_plain(ckpt, *t.info);
    ASSERT_EQ(std::memcmp(t.data, plain.data(), plain.size()), 0) << t.info->name;
  }
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Everywhere (Windows included, where mapping files for DMA is not supported): the option is
// accepted, the load is exact, and every file says why it took the staged path.
TEST(PageCacheDmaOption, IsAcceptedEverywhereAndEveryFileNotCopiedSaysWhy) {
  TempDir dir;
  test::write_random_checkpoint(dir / "a.safetensors", odd_specs(), 21);
  auto ckpt = Checkpoint::open_shared(dir / "a.safetensors");
  LoadOptions options;
  set_load_option(options, "page_cache_pin", "1GiB");
  LoadedCheckpoint loaded = load(ckpt, options);  // host memory, the process's registry
  expect_plain_bytes(*ckpt, loaded);
  ASSERT_EQ(loaded.stats().files.size(), 1u);
  const std::string& reason = loaded.stats().files[0].reason;
  EXPECT_NE(loaded.stats().files[0].io_path, IoPath::PageCacheDma);
  EXPECT_TRUE(contains(reason, detail::file_mapping_supported()
                                   ? "page-cache DMA not used: its destination is host memory"
                                   : "page-cache DMA not used: not supported on this platform"))
      << reason;
  EXPECT_EQ(loaded.stats().bytes_from_registered_page_cache, 0u);
}

class PageCacheDma : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!detail::file_mapping_supported()) GTEST_SKIP() << "no file mappings on this platform";
  }
};

TEST_F(PageCacheDma, LoadsAreBitExactAndTheSecondReusesTheRegistration) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  test::write_random_checkpoint(file, odd_specs(), 5);
  StandIn driver;
  detail::ScopedPageCacheRegistry scoped(driver.registrar());
  auto ckpt = Checkpoint::open_shared(file);
  for (int round = 0; round < 2; ++round) {
    LoadedCheckpoint loaded = load(ckpt, pinned_options(1ull << 30));
    expect_plain_bytes(*ckpt, loaded);
    const LoadStats& s = loaded.stats();
    ASSERT_EQ(s.files.size(), 1u);
    EXPECT_EQ(s.files[0].io_path, IoPath::PageCacheDma) << s.files[0].reason;
    EXPECT_GT(s.bytes_from_registered_page_cache, 0u);
    EXPECT_EQ(s.bytes_from_registered_page_cache, s.bytes_read);
    EXPECT_EQ(s.staging_bytes, 0u);  // no group needed a slot
    EXPECT_EQ(contains(s.files[0].reason, "registered by this transfer"), round == 0)
        << s.files[0].reason;
    if (round == 1) {
      EXPECT_EQ(s.page_cache_register_seconds, 0.0);
    }
  }
  EXPECT_EQ(driver.registered, 1);
  const std::string json = to_json(load(ckpt, pinned_options(1ull << 30)).stats());
  EXPECT_TRUE(contains(json, "\"bytes_from_registered_page_cache\"")) << json;
  EXPECT_TRUE(contains(json, "\"page-cache-dma\"")) << json;
}

// A load prepared with its checkpoint finds each file registered ahead: it registers nothing,
// and copies every byte from the registrations, bit-exact.
TEST_F(PageCacheDma, APreparedLoadFindsItsFilesRegisteredAhead) {
  TempDir dir;
  test::write_random_checkpoint(dir / "model-00001-of-00002.safetensors", odd_specs(), 41);
  test::write_random_checkpoint(dir / "model-00002-of-00002.safetensors",
                                {{"z", DType::F32, {300000}}}, 42);
  StandIn driver;
  detail::ScopedPageCacheRegistry scoped(driver.registrar());
  auto ckpt = Checkpoint::open_shared(dir.path());
  const WarmUpReport report = LoadPreparation(pinned_options(1ull << 30), ckpt).wait();
  EXPECT_EQ(driver.registered, 2) << report.page_cache_why_not;
  std::uint64_t file_bytes = 0;
  for (const auto& f : ckpt->files()) file_bytes += f.size;  // just written: in the page cache
  EXPECT_EQ(report.page_cache_bytes, file_bytes);
  EXPECT_EQ(report.page_cache_why_not, "");
  LoadedCheckpoint loaded = load(ckpt, pinned_options(1ull << 30));
  expect_plain_bytes(*ckpt, loaded);
  EXPECT_EQ(driver.registered, 2);  // nothing registered by the load
  for (const auto& f : loaded.stats().files) {
    EXPECT_EQ(f.io_path, IoPath::PageCacheDma) << f.reason;
    EXPECT_FALSE(contains(f.reason, "registered by this transfer")) << f.reason;
  }
  EXPECT_EQ(loaded.stats().page_cache_register_seconds, 0.0);

  // Without page_cache_pin, or for a device the registrations do not serve: nothing registered,
  // and the report says why for the latter.
  StandIn other;
  detail::ScopedPageCacheRegistry again(other.registrar());
  LoadOptions plain = pinned_options(0);
  EXPECT_EQ(LoadPreparation(plain, ckpt).wait().page_cache_bytes, 0u);
  EXPECT_EQ(other.registered, 0);
}

TEST_F(PageCacheDma, ARewrittenFileIsLoadedWithItsNewBytes) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  StandIn driver;
  detail::ScopedPageCacheRegistry scoped(driver.registrar());
  test::write_random_checkpoint(file, odd_specs(), 1);
  expect_plain_bytes(*Checkpoint::open_shared(file),
                     load(Checkpoint::open_shared(file), pinned_options(1ull << 30)));
  // Replaced by a rename, as writers that save atomically do: new bytes at the same path.
  test::write_random_checkpoint(dir / "next.safetensors", odd_specs(), 2);
  std::filesystem::rename(dir / "next.safetensors", file);
  auto renamed = Checkpoint::open_shared(file);
  LoadedCheckpoint again = load(renamed, pinned_options(1ull << 30));
  expect_plain_bytes(*renamed, again);
  EXPECT_TRUE(contains(again.stats().files[0].reason, "registered by this transfer"));
  // Rewritten in place with another size: the same inode, a new identity.
  auto specs = odd_specs();
  specs.push_back({"extra", DType::U8, {4097}});
  test::write_random_checkpoint(file, specs, 3);
  auto rewritten = Checkpoint::open_shared(file);
  LoadedCheckpoint third = load(rewritten, pinned_options(1ull << 30));
  expect_plain_bytes(*rewritten, third);
  EXPECT_EQ(third.stats().files[0].io_path, IoPath::PageCacheDma);
  EXPECT_EQ(driver.registered, 3);
}

TEST_F(PageCacheDma, TheBudgetKeepsTheMostRecentFilesAndALargerFileTakesTheStagedPath) {
  TempDir dir;
  StandIn driver;
  detail::ScopedPageCacheRegistry scoped(driver.registrar());
  test::write_random_checkpoint(dir / "a.safetensors", odd_specs(), 7);
  test::write_random_checkpoint(dir / "b.safetensors", odd_specs(), 8);
  auto a = Checkpoint::open_shared(dir / "a.safetensors");
  auto b = Checkpoint::open_shared(dir / "b.safetensors");
  const std::uint64_t size = std::filesystem::file_size(dir / "a.safetensors");
  const std::uint64_t budget = size + size / 2;  // one file fits, not two
  expect_plain_bytes(*a, load(a, pinned_options(budget)));
  expect_plain_bytes(*b, load(b, pinned_options(budget)));
  EXPECT_EQ(driver.unregistered, 1);  // a made room for b
  LoadedCheckpoint a_again = load(a, pinned_options(budget));
  expect_plain_bytes(*a, a_again);
  EXPECT_TRUE(contains(a_again.stats().files[0].reason, "registered by this transfer"));
  EXPECT_EQ(driver.registered, 3);

  LoadedCheckpoint small = load(b, pinned_options(size - 1));
  expect_plain_bytes(*b, small);
  const FileLoadStats& f = small.stats().files[0];
  EXPECT_NE(f.io_path, IoPath::PageCacheDma);
  EXPECT_TRUE(contains(f.reason, "page-cache DMA not used: the file")) << f.reason;
  EXPECT_TRUE(contains(f.reason, "larger than the budget")) << f.reason;
  EXPECT_EQ(small.stats().bytes_from_registered_page_cache, 0u);
}

#ifndef _WIN32
TEST_F(PageCacheDma, AFileNotInThePageCacheTakesTheStagedPathAndSaysSo) {
  TempDir dir;
  const auto file = dir / "cold.safetensors";
  test::write_random_checkpoint(file, odd_specs(), 9);
  {
    const int fd = ::open(file.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::fdatasync(fd), 0);
    ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    const double left = detail::page_cache_fraction(static_cast<detail::NativeFile>(fd),
                                                    std::filesystem::file_size(file));
    ::close(fd);
    if (left > 0.5) GTEST_SKIP() << "this file system keeps pages after POSIX_FADV_DONTNEED";
  }
  StandIn driver;
  detail::ScopedPageCacheRegistry scoped(driver.registrar());
  auto ckpt = Checkpoint::open_shared(file);  // reads the header: the rest stays cold
  LoadedCheckpoint loaded = load(ckpt, pinned_options(1ull << 30));
  expect_plain_bytes(*ckpt, loaded);
  const FileLoadStats& f = loaded.stats().files[0];
  EXPECT_NE(f.io_path, IoPath::PageCacheDma);
  EXPECT_TRUE(contains(f.reason, "page-cache DMA not used: not fully in the page cache"))
      << f.reason;
  EXPECT_EQ(loaded.stats().bytes_from_registered_page_cache, 0u);
  EXPECT_EQ(driver.registered, 0);
}
#endif

TEST_F(PageCacheDma, HostMemoryIsNotRegisteredWithTheGpuDriverAndSaysSo) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  test::write_random_checkpoint(file, odd_specs(), 12);
  auto ckpt = Checkpoint::open_shared(file);
  LoadedCheckpoint loaded = load(ckpt, pinned_options(1ull << 30));  // the process's registry
  expect_plain_bytes(*ckpt, loaded);
  const FileLoadStats& f = loaded.stats().files[0];
  EXPECT_NE(f.io_path, IoPath::PageCacheDma);
  EXPECT_TRUE(contains(f.reason, "its destination is host memory")) << f.reason;
  EXPECT_EQ(release_page_cache_registrations(), 0u);
}

TEST_F(PageCacheDma, AnExtentPastTheRegisteredSizeFailsAloneWhileTheOthersLand) {
  TempDir dir;
  const auto path = dir / "f.bin";
  const auto bytes = test::random_bytes(3 << 20, 4);
  test::write_file(path, std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  StandIn driver;
  detail::ScopedPageCacheRegistry scoped(driver.registrar());
  auto files = FileSet::create();
  files->add(path);
  std::vector<std::byte> a(1 << 20), b(5000), hole_and_c(7000), past(100);
  std::vector<Extent> extents;
  extents.push_back({0, 12345, {{Device::cpu(), a.data(), a.size()}}});
  extents.push_back({0, (3 << 20) - 5000, {{Device::cpu(), b.data(), b.size()}}});
  extents.push_back({0,
                     1,
                     {{Device::cpu(), nullptr, 1000},
                      {Device::cpu(), hole_and_c.data() + 1000, hole_and_c.size() - 1000}}});
  extents.push_back({0, (3 << 20) - 50, {{Device::cpu(), past.data(), past.size()}}});
  TransferOptions options;
  options.page_cache_pin_bytes = 1ull << 30;
  options.chunk_bytes = 1 << 20;
  Ticket ticket = submit(files, Direction::FileToMemory, std::move(extents), options);
  ticket.wait();
  for (std::size_t e = 0; e < 3; ++e)
    EXPECT_EQ(ticket.status(e).state, ExtentStatus::State::Done) << ticket.status(e).error;
  EXPECT_EQ(ticket.status(3).state, ExtentStatus::State::Failed);
  EXPECT_TRUE(contains(ticket.status(3).error, path.filename().string())) << ticket.status(3).error;
  EXPECT_EQ(std::memcmp(a.data(), bytes.data() + 12345, a.size()), 0);
  EXPECT_EQ(std::memcmp(b.data(), bytes.data() + (3 << 20) - 5000, b.size()), 0);
  EXPECT_EQ(std::memcmp(hole_and_c.data() + 1000, bytes.data() + 1001, 6000), 0);
  const TransferStats& s = ticket.stats();
  EXPECT_EQ(s.bytes_from_registered_page_cache, a.size() + b.size() + hole_and_c.size());
  ASSERT_EQ(s.files.size(), 1u);
  EXPECT_EQ(s.files[0].io_path, IoPath::PageCacheDma);
  EXPECT_TRUE(contains(s.files[0].reason, "past its registered size")) << s.files[0].reason;
}

// Copies from a mapping are coalesced where the bytes continue in the file and in memory on one
// device: a load into one allocation in file order is a few large copies, not one per read.
TEST(PageCacheDmaCopies, RunsContinueOnlyWhereFileAndMemoryBothContinue) {
  std::vector<std::byte> memory(1000), other(100);
  const std::byte* map = reinterpret_cast<const std::byte*>(std::uintptr_t{1} << 20);
  // Extent 0: file [0, 300) -> memory [0, 300); extent 1: file [300, 500) -> memory [300, 400),
  // a hole of 50, memory [450, 500); extent 2: file [500, 600) -> `other`.
  std::vector<Extent> x = {
      {0, 0, {{Device::cpu(), memory.data(), 300}}},
      {0, 300,
       {{Device::cpu(), memory.data() + 300, 100},
        {Device::cpu(), nullptr, 50},
        {Device::cpu(), memory.data() + 450, 50}}},
      {0, 500, {{Device::cpu(), other.data(), 100}}}};
  std::vector<detail::CopyRun> runs;
  detail::add_copy_runs(x[0], {0, 0, 300}, 0, map, runs);
  detail::add_copy_runs(x[1], {1, 0, 200}, 1, map + 300, runs);
  detail::add_copy_runs(x[2], {2, 0, 100}, 2, map + 500, runs);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].memory, reinterpret_cast<std::uintptr_t>(memory.data()));
  EXPECT_EQ(runs[0].source, map);
  EXPECT_EQ(runs[0].size, 400u);  // extent 0 and the first span of extent 1
  EXPECT_EQ(runs[0].first_piece, 0u);
  EXPECT_EQ(runs[0].last_piece, 1u);
  EXPECT_EQ(runs[1].memory, reinterpret_cast<std::uintptr_t>(memory.data() + 450));
  EXPECT_EQ(runs[1].source, map + 450);  // after the hole: the source jumped, a new copy
  EXPECT_EQ(runs[1].size, 50u);
  EXPECT_EQ(runs[2].memory, reinterpret_cast<std::uintptr_t>(other.data()));
  EXPECT_EQ(runs[2].size, 100u);
  EXPECT_EQ(runs[2].first_piece, 2u);
  // The same bytes on another device never join a run.
  std::vector<detail::CopyRun> split;
  std::vector<Extent> two = {{0, 0, {{Device::cpu(), memory.data(), 10}}},
                             {0, 10, {{Device::cuda(0), memory.data() + 10, 10}}}};
  detail::add_copy_runs(two[0], {0, 0, 10}, 0, map, split);
  detail::add_copy_runs(two[1], {1, 0, 10}, 1, map + 10, split);
  EXPECT_EQ(split.size(), 2u);
}

}  // namespace
}  // namespace ferry
