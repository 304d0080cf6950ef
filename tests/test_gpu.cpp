// GPU loads, bit-exact with the plain host path. Skipped where no CUDA device is usable.
#include <gtest/gtest.h>

#include <cstring>

#include "cuda/cuda_resources.hpp"
#include "cuda/device_memory_cache.hpp"
#include "ferry/error.hpp"
#include "ferry/load_preparation.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "ferry/tensor_digest.hpp"
#include "ferry/transfer.hpp"
#include "services/pinned_pool.hpp"
#include "shim/cuda_driver.hpp"
#include "staging_limit.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

using test::TempDir;

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available())
      GTEST_SKIP() << "no usable GPU: " << shim::CudaDriver::get().why_unusable;
  }
};

std::vector<TensorSpec> mixed_specs() {
  std::vector<TensorSpec> specs;
  const std::uint64_t sizes[] = {3, 4096, 1, 70001, 255, 5 << 20, 12345, 0, (3 << 20) + 7, 999};
  for (std::size_t i = 0; i < std::size(sizes); ++i)
    specs.push_back({"g" + std::to_string(i), DType::U8, {sizes[i]}});
  for (unsigned i = 0; i < 300; ++i) specs.push_back({"s" + std::to_string(i), DType::BF16, {64u + i}});
  return specs;
}

TEST_F(Gpu, EveryConfigurationMatchesThePlainHostPath) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  auto written = test::write_random_checkpoint(file, mixed_specs(), 41);
  auto ckpt = Checkpoint::open_shared(file);
  for (IoMode io : {IoMode::Buffered, IoMode::Direct, IoMode::Auto})
    for (std::uint64_t chunk : {std::uint64_t{0}, std::uint64_t{4096}, std::uint64_t{1 << 20}}) {
      LoadOptions options;
      options.device = Device::cuda(0);
      options.io = io;
      options.chunk_bytes = chunk;
      options.staging_bytes = chunk == 4096 ? (1 << 20) : (64 << 20);
      std::unique_ptr<LoadedCheckpoint> loaded;
      try {
        loaded = std::make_unique<LoadedCheckpoint>(load(ckpt, options));
      } catch (const std::invalid_argument& e) {
        ASSERT_EQ(io, IoMode::Direct) << e.what();  // only O_DIRECT may be refused (tmpfs)
        continue;
      }
      EXPECT_TRUE(loaded->stats().staging_pinned);
      for (const auto& t : loaded->tensors()) {
        auto plain = test::read_plain(*ckpt, *t.info);
        auto device = test::read_device(t.data, t.info->size);
        ASSERT_EQ(device, plain) << t.info->name << " io=" << static_cast<int>(io)
                                 << " chunk=" << chunk;
        ASSERT_EQ(tensor_digest(*loaded, t), bytes_digest(written.at(t.info->name)));
        ASSERT_EQ(reinterpret_cast<std::uintptr_t>(t.data) % 256, 0u);
      }
    }
}

// A load prepared ahead finds its staging pinned and its streams made: it pins nothing more and
// lands the same bytes as the plain host path.
TEST_F(Gpu, APreparedLoadUsesTheStagingPinnedAhead) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  test::write_random_checkpoint(file, mixed_specs(), 43);
  auto ckpt = Checkpoint::open_shared(file);
  test::StagingLimit limit(1ull << 30);  // idle staging freed: this test's slabs alone
  LoadOptions options;
  options.device = Device::cuda(0);
  options.reader_threads = 4;
  options.chunk_bytes = 1 << 20;
  const WarmUpReport report = LoadPreparation(options).wait();
  EXPECT_EQ(report.slabs, 4u);
  EXPECT_TRUE(report.pinned);
  EXPECT_EQ(report.streams, 4u);
  const auto held = detail::staging_pool().stats().held_bytes;
  EXPECT_EQ(held, report.staging_bytes);
  const LoadedCheckpoint loaded = load(ckpt, options);
  EXPECT_TRUE(loaded.stats().staging_pinned);
  EXPECT_EQ(detail::staging_pool().stats().high_water, held);  // no slab made
  for (const auto& t : loaded.tensors())
    ASSERT_EQ(test::read_device(t.data, t.info->size), test::read_plain(*ckpt, *t.info))
        << t.info->name;
}

// With page_cache_pin and its checkpoint, a preparation registers the files for page-cache DMA:
// the load registers nothing and copies every byte from the page cache, as the host path reads.
TEST_F(Gpu, APreparedLoadFindsItsFilesRegisteredForPageCacheDma) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  test::write_random_checkpoint(file, mixed_specs(), 44);  // just written: in the page cache
  auto ckpt = Checkpoint::open_shared(file);
  LoadOptions options;
  options.device = Device::cuda(0);
  options.page_cache_pin_bytes = 1ull << 30;
  const WarmUpReport report = LoadPreparation(options, ckpt).wait();
  ASSERT_EQ(report.page_cache_bytes, ckpt->files()[0].size) << report.page_cache_why_not;
  const LoadedCheckpoint loaded = load(ckpt, options);
  ASSERT_EQ(loaded.stats().files.size(), 1u);
  const auto& f = loaded.stats().files[0];
  EXPECT_EQ(f.io_path, IoPath::PageCacheDma) << f.reason;
  EXPECT_EQ(f.reason.find("registered by this transfer"), std::string::npos) << f.reason;
  for (const auto& t : loaded.tensors())
    ASSERT_EQ(test::read_device(t.data, t.info->size), test::read_plain(*ckpt, *t.info))
        << t.info->name;
  release_page_cache_registrations();
}

// Profiled loads time each slot's copies on the GPU, and workers may share copy streams: the
// same bytes either way, and a busy time within the copies' span.
TEST_F(Gpu, ProfiledLoadsAndSharedCopyStreamsLandTheSameBytes) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  auto written = test::write_random_checkpoint(file, mixed_specs(), 43);
  auto ckpt = Checkpoint::open_shared(file);
  for (auto [threads, streams] : {std::pair{1u, 0u}, {4u, 0u}, {4u, 1u}, {4u, 2u}, {2u, 8u}}) {
    LoadOptions options;
    options.device = Device::cuda(0);
    options.io = IoMode::Buffered;
    options.chunk_bytes = 256 << 10;
    options.reader_threads = threads;
    options.copy_streams = streams;
    options.profile = true;
    auto loaded = load(ckpt, options);
    for (const auto& t : loaded.tensors())
      ASSERT_EQ(tensor_digest(loaded, t), bytes_digest(written.at(t.info->name))) << t.info->name;
    const PipelineTimes& p = loaded.stats().pipeline;
    EXPECT_GT(p.copy_groups, 0u);
    EXPECT_GT(p.copy_busy, 0.0);
    EXPECT_LE(p.copy_busy, p.copy_span * (1 + 1e-9));
    EXPECT_GT(p.first_copy, 0.0);
    EXPECT_LE(p.first_copy, p.last_copy);
    EXPECT_LE(p.last_copy, p.copies_done);
    EXPECT_LE(p.copies_done, p.done);
  }
}

TEST_F(Gpu, LoadIntoDeviceMemoryTheCallerOwns) {
  TempDir dir;
  auto written = test::write_random_checkpoint(dir / "m.safetensors", mixed_specs(), 42);
  auto ckpt = Checkpoint::open(dir / "m.safetensors");
  auto context = std::make_shared<detail::PrimaryContext>(0);
  auto a = detail::allocate_device_memory(context, 70001);
  auto b = detail::allocate_device_memory(context, 5 << 20);
  std::vector<TensorDestination> dst = {{"g3", a.get(), 70001}, {"g5", b.get(), 5 << 20}};
  LoadOptions options;
  options.device = Device::cuda(0);
  load_into(ckpt, dst, options);
  EXPECT_EQ(test::read_device(a.get(), 70001), written.at("g3"));
  EXPECT_EQ(test::read_device(b.get(), 5 << 20), written.at("g5"));
}

// Page-cache DMA: a file just written is in the page cache; the first load maps and registers
// it, the second copies every byte from the kept registration. Both bit-exact with the plain
// host path.
TEST_F(Gpu, PageCacheDmaLoadsTwiceBitExactTheSecondFromTheKeptRegistration) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  auto written = test::write_random_checkpoint(file, mixed_specs(), 44);
  auto ckpt = Checkpoint::open_shared(file);
  LoadOptions options;
  options.device = Device::cuda(0);
  options.page_cache_pin_bytes = 1ull << 30;
  for (int round = 0; round < 2; ++round) {
    auto loaded = load(ckpt, options);
    for (const auto& t : loaded.tensors()) {
      const auto plain = test::read_plain(*ckpt, *t.info);
      ASSERT_EQ(test::read_device(t.data, t.info->size), plain) << t.info->name;
      ASSERT_EQ(tensor_digest(loaded, t), bytes_digest(written.at(t.info->name))) << t.info->name;
    }
    const LoadStats& s = loaded.stats();
    ASSERT_EQ(s.files.size(), 1u);
    ASSERT_EQ(s.files[0].io_path, IoPath::PageCacheDma) << s.files[0].reason;
    EXPECT_EQ(s.bytes_from_registered_page_cache, s.bytes_read);
    EXPECT_GT(s.bytes_from_registered_page_cache, 0u);
    if (round == 1) {
      EXPECT_EQ(s.page_cache_register_seconds, 0.0);
      EXPECT_NE(s.files[0].reason.find("registered by an earlier transfer"), std::string::npos)
          << s.files[0].reason;
    }
  }
  EXPECT_EQ(release_page_cache_registrations(), 0u);  // nothing in flight holds one
}

// The device memory cache: a freed load's memory stays in the cache and serves the next load
// (the cache does not grow), bit-exact on the staged path and with page-cache DMA; releasing it
// hands back all but what a live load holds.
TEST_F(Gpu, DeviceMemoryCacheServesTheNextLoadUntilReleased) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  auto written = test::write_random_checkpoint(file, mixed_specs(), 45);
  auto ckpt = Checkpoint::open_shared(file);
  LoadOptions options;
  options.device = Device::cuda(0);
  options.cache_device_memory = true;
  std::uint64_t cached = 0;
  for (std::uint64_t pin : {std::uint64_t{0}, std::uint64_t{1} << 30}) {
    options.page_cache_pin_bytes = pin;
    for (int round = 0; round < 3; ++round) {
      auto loaded = load(ckpt, options);
      for (const auto& t : loaded.tensors())
        ASSERT_EQ(tensor_digest(loaded, t), bytes_digest(written.at(t.info->name)))
            << t.info->name << " pin=" << pin << " round " << round;
      const std::uint64_t held = detail::device_memory_cache_bytes();
      EXPECT_GE(held, loaded.stats().allocated_bytes);
      if (cached == 0) cached = held;
      EXPECT_EQ(held, cached) << "a later load took new memory instead of the cached";
    }
    EXPECT_EQ(detail::device_memory_cache_bytes(), cached);  // freed into the cache, kept
  }
  {
    auto alive = load(ckpt, options);
    EXPECT_GE(release_cached_device_memory(), alive.stats().allocated_bytes);
    for (const auto& t : alive.tensors())  // the live load's bytes untouched by the release
      ASSERT_EQ(tensor_digest(alive, t), bytes_digest(written.at(t.info->name))) << t.info->name;
  }
  EXPECT_EQ(release_cached_device_memory(), 0u);
  EXPECT_EQ(detail::device_memory_cache_bytes(), 0u);
  options.cache_device_memory = false;  // loads without the cache never fill it
  auto plain = load(ckpt, options);
  EXPECT_EQ(detail::device_memory_cache_bytes(), 0u);
}

// load_into refills a load's own memory: the first load's tensors again, bit-exact (the weight
// refresh of `ferry load --refill`), with and without page-cache DMA.
TEST_F(Gpu, LoadIntoRefillsAnEarlierLoadsTensors) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  auto written = test::write_random_checkpoint(file, mixed_specs(), 46);
  auto ckpt = Checkpoint::open_shared(file);
  LoadOptions options;
  options.device = Device::cuda(0);
  auto first = load(ckpt, options);
  std::vector<TensorDestination> refill;
  for (const auto& t : first.tensors()) refill.push_back({t.info->name, t.data, t.info->size});
  for (std::uint64_t pin : {std::uint64_t{0}, std::uint64_t{1} << 30}) {
    options.page_cache_pin_bytes = pin;
    // Scribble over the first load so that only a refill can restore its bytes.
    auto& d = shim::CudaDriver::get();
    ASSERT_EQ(d.cuMemsetD8Async(reinterpret_cast<shim::cu::DevicePtr>(first.memory().get()), 0xA5,
                                first.stats().allocated_bytes, nullptr),
              shim::cu::kSuccess);
    ASSERT_EQ(d.cuStreamSynchronize(nullptr), shim::cu::kSuccess);
    const LoadStats s = load_into(*ckpt, refill, options);
    EXPECT_EQ(s.tensor_bytes, first.stats().tensor_bytes);
    EXPECT_EQ(s.allocated_bytes, 0u);
    for (const auto& t : first.tensors())
      ASSERT_EQ(tensor_digest(first, t), bytes_digest(written.at(t.info->name)))
          << t.info->name << " pin=" << pin;
  }
}

TEST_F(Gpu, MissingDeviceIsAClearError) {
  TempDir dir;
  test::write_random_checkpoint(dir / "m.safetensors", mixed_specs(), 43);
  auto ckpt = Checkpoint::open_shared(dir / "m.safetensors");
  LoadOptions options;
  options.device = Device::cuda(999);
  EXPECT_THROW(load(ckpt, options), CudaError);
}

}  // namespace
}  // namespace ferry
