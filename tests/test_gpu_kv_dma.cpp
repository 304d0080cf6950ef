// KV gets by page-cache DMA on a real GPU (KVStoreOptions::page_cache_pin_bytes; the CUDA
// driver's registrar): round trips bit-exact against the bytes put for 4 KiB..16 MiB blocks and
// per-layer pieces, the route and reason per key, host destinations on the host path, a put into
// a registered window then a get, a corrupt slab byte a miss, a window written behind the store
// (O_DIRECT, as another process's put) read back right. Skipped without a GPU.
#include <gtest/gtest.h>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"
#include "kv_page_cache_support.hpp"
#include "shim/cuda_driver.hpp"

namespace ferry::test {
namespace {

constexpr std::uint64_t kKiB = 1024, kMiB = 1024 * 1024;
constexpr std::uint64_t kPin = 1ull << 30;

bool has(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

class GpuKvDma : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available())
      GTEST_SKIP() << "no usable GPU: " << shim::CudaDriver::get().why_unusable;
    context = std::make_shared<detail::PrimaryContext>(0);
    context->make_current();
  }
  KVStore open(std::uint64_t capacity, std::uint64_t block) {
    return KVStore::open(dir.path(), kv_namespace(), capacity, block, page_cache_options(kPin));
  }
  std::shared_ptr<void> device(std::uint64_t size) {
    return detail::allocate_device_memory(context, size);
  }
  std::vector<std::byte> download(const void* from, std::uint64_t size) {
    std::vector<std::byte> out(size);
    context->make_current();
    FERRY_CU(cuMemcpyDtoH, out.data(), reinterpret_cast<shim::cu::DevicePtr>(from), size);
    return out;
  }
  // One key's block into a fresh device buffer: the result and the bytes that landed.
  std::pair<KVResult, std::vector<std::byte>> get_to_gpu(KVStore& store, KVKey key,
                                                         std::uint64_t size) {
    auto target = device(size);
    KVPiece piece{target.get(), size, Device::cuda(0)};
    KVBlock block(&piece, 1);
    auto result = store.get(std::span(&key, 1), std::span(&block, 1))[0];
    return {result, download(target.get(), size)};
  }
  TempDir dir;
  std::shared_ptr<detail::PrimaryContext> context;
};

TEST_F(GpuKvDma, RoundTripsThroughRegisteredWindowsAreBitExact) {
  for (std::uint64_t size : {4 * kKiB, 4 * kKiB + 100, 256 * kKiB, 1 * kMiB, 16 * kMiB}) {
    SCOPED_TRACE(size);
    TempDir here;
    const std::size_t n = size > kMiB ? 3 : 8;
    auto store = KVStore::open(here.path(), kv_namespace(), n * ((size + 4095) / 4096 * 4096),
                               size, page_cache_options(kPin));
    std::vector<KVKey> keys;
    for (std::size_t i = 0; i < n; ++i) {
      keys.push_back(100 + i);
      ASSERT_TRUE(put_one(store, keys.back(), kv_bytes(keys.back(), size)).ok());
    }
    warm_slab(here.path());
    auto memory = device(n * size);
    std::vector<KVPiece> pieces;
    for (std::size_t i = 0; i < n; ++i)
      pieces.push_back({static_cast<std::byte*>(memory.get()) + i * size, size, Device::cuda(0)});
    std::vector<KVBlock> blocks;
    for (const KVPiece& p : pieces) blocks.emplace_back(&p, 1);
    for (const char* pass : {"registered by this get", "registered earlier"}) {
      const auto results = store.get(keys, blocks);
      const auto got = download(memory.get(), n * size);
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(results[i].ok()) << results[i].message;
        EXPECT_EQ(results[i].route, KVRoute::page_cache_dma) << results[i].route_reason;
        EXPECT_TRUE(has(results[i].route_reason, pass)) << results[i].route_reason;
        const auto want = kv_bytes(keys[i], size);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + i * size)) << i;
      }
    }
    const KVStats stats = store.stats();
    EXPECT_EQ(stats.page_cache_dma_bytes, 2 * n * size);
    EXPECT_GE(stats.page_cache_windows_registered, 1u);
    EXPECT_EQ(stats.page_cache_stale_rereads, 0u);
  }
}

TEST_F(GpuKvDma, PerLayerPiecesAreCopiedFromTheWindow) {
  // 8 layers x K, V in two device buffers (as a paged cache's K and V tensors) plus an odd tail.
  const std::uint64_t piece = 24 * kKiB + 512, tail = 1000;
  const std::uint64_t size = 16 * piece + tail;
  auto store = open(4 * ((size + 4095) / 4096 * 4096), size);
  const KVKey key = 5;
  const auto bytes = kv_bytes(key, size);
  ASSERT_TRUE(put_one(store, key, bytes).ok());
  warm_slab(dir.path());
  auto k = device(8 * piece), v = device(8 * piece + tail);
  std::vector<KVPiece> pieces;
  for (int layer = 0; layer < 8; ++layer) {
    pieces.push_back({static_cast<std::byte*>(k.get()) + layer * piece, piece, Device::cuda(0)});
    pieces.push_back({static_cast<std::byte*>(v.get()) + layer * piece, piece, Device::cuda(0)});
  }
  pieces.push_back({static_cast<std::byte*>(v.get()) + 8 * piece, tail, Device::cuda(0)});
  KVBlock block(pieces);
  const auto r = store.get(std::span(&key, 1), std::span(&block, 1))[0];
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(r.route, KVRoute::page_cache_dma) << r.route_reason;
  const auto got_k = download(k.get(), 8 * piece), got_v = download(v.get(), 8 * piece + tail);
  std::uint64_t at = 0;
  for (int layer = 0; layer < 8; ++layer) {
    EXPECT_TRUE(std::equal(bytes.begin() + at, bytes.begin() + at + piece,
                           got_k.begin() + layer * piece));
    at += piece;
    EXPECT_TRUE(std::equal(bytes.begin() + at, bytes.begin() + at + piece,
                           got_v.begin() + layer * piece));
    at += piece;
  }
  EXPECT_TRUE(std::equal(bytes.begin() + at, bytes.end(), got_v.begin() + 8 * piece));
}

TEST_F(GpuKvDma, HostDestinationsTakeTheHostPathAndSaySo) {
  const std::uint64_t size = 64 * kKiB;
  auto store = open(4 * size, size);
  ASSERT_TRUE(put_one(store, 1, kv_bytes(1, size)).ok());
  warm_slab(dir.path());
  std::vector<std::byte> out(size);
  const auto r = get_one(store, 1, out);
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(r.route, KVRoute::host);
  EXPECT_TRUE(has(r.route_reason, "host memory")) << r.route_reason;
  EXPECT_EQ(out, kv_bytes(1, size));
  EXPECT_EQ(store.stats().page_cache_dma_bytes, 0u);
}

TEST_F(GpuKvDma, APutIntoARegisteredWindowThenAGetReturnsTheNewBytes) {
  const std::uint64_t size = 256 * kKiB;
  auto store = open(2 * size, size);  // two slots: the third put evicts the first's
  ASSERT_TRUE(put_one(store, 1, kv_bytes(1, size)).ok());
  ASSERT_TRUE(put_one(store, 2, kv_bytes(2, size)).ok());
  warm_slab(dir.path());
  for (KVKey key : {1, 2}) {
    auto [r, got] = get_to_gpu(store, key, size);
    ASSERT_TRUE(r.ok()) << r.message;
    EXPECT_EQ(r.route, KVRoute::page_cache_dma) << r.route_reason;
  }
  ASSERT_TRUE(put_one(store, 3, kv_bytes(3, size)).ok());  // into slot 0, a registered window
  warm_slab(dir.path());
  for (KVKey key : {3, 2}) {
    auto [r, got] = get_to_gpu(store, key, size);
    ASSERT_TRUE(r.ok()) << key << ": " << r.message;
    EXPECT_EQ(got, kv_bytes(key, size)) << key;
    EXPECT_EQ(r.route, KVRoute::page_cache_dma) << r.route_reason;
  }
  EXPECT_EQ(store.stats().page_cache_stale_rereads, 0u);  // the put released the window
}

TEST_F(GpuKvDma, ACorruptSlabByteIsAMiss) {
  const std::uint64_t size = 64 * kKiB;
  auto store = open(4 * size, size);
  ASSERT_TRUE(put_one(store, 1, kv_bytes(1, size)).ok());
  warm_slab(dir.path());
  ASSERT_TRUE(get_to_gpu(store, 1, size).first.ok());  // its window registered
  auto bad = slot_image(kv_bytes(1, size));
  bad[777] ^= std::byte{0x01};
  ASSERT_TRUE(write_behind(dir.path(), 0, bad, false));
  const auto [r, got] = get_to_gpu(store, 1, size);
  EXPECT_EQ(r.status, KVStatus::missing) << to_string(r.route);
  EXPECT_TRUE(has(r.message, "checksum")) << r.message;
  EXPECT_FALSE(store.contains(std::vector<KVKey>{1})[0]);
  EXPECT_EQ(store.stats().corrupt_dropped, 1u);
}

// Another process's put goes around the page cache (O_DIRECT) into a slot of a window this one
// has registered: whatever the kernel does with the pinned pages (keeps them stale, or writes
// through them), the get returns the new bytes.
TEST_F(GpuKvDma, AWindowWrittenBehindTheStoreIsReadBackRight) {
  const std::uint64_t size = 64 * kKiB;
  auto store = open(4 * size, size);
  ASSERT_TRUE(put_one(store, 1, kv_bytes(1, size)).ok());
  ASSERT_TRUE(put_one(store, 2, kv_bytes(2, size)).ok());
  // Slot 1 holds other bytes when the window is registered, then key 2's again on the disk.
  ASSERT_TRUE(write_behind(dir.path(), size, slot_image(kv_bytes(9, size)), false));
  warm_slab(dir.path());
  ASSERT_TRUE(get_to_gpu(store, 1, size).first.ok());
  if (!write_behind(dir.path(), size, slot_image(kv_bytes(2, size)), true))
    GTEST_SKIP() << "no O_DIRECT writes on " << dir.path();
  const auto [r, got] = get_to_gpu(store, 2, size);
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(got, kv_bytes(2, size));
  if (r.route != KVRoute::page_cache_dma) {
    EXPECT_TRUE(has(r.route_reason, "stale")) << r.route_reason;
    EXPECT_EQ(store.stats().page_cache_stale_rereads, 1u);
  }
}

}  // namespace
}  // namespace ferry::test
