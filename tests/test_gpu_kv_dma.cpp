// KV gets by page-cache DMA on a real GPU (KVStoreOptions::page_cache_pin_bytes; the CUDA
// driver's registrar; each block checked by the GPU checksum where it landed): round trips
// bit-exact against the bytes put for 4 KiB..16 MiB blocks (several chunks, both streams) and
// per-layer pieces (through the device bounce buffer) beside single-piece blocks in one get, the
// route and reason per key, host destinations on the host path, a put into a registered window
// then a get, a corrupt slab byte a miss, a window written behind the store (O_DIRECT, as
// another process's put) read back right, and a window made stale on purpose (its pages punched
// out of the page cache while pinned) found by the GPU checksum and re-read from the file, for
// single- and multi-piece blocks. Skipped without a GPU (and, where this build has no GPU
// checksum, all but the test of the reason given then). Gets expected to find their window warm
// go through get_warm (kv_page_cache_support.hpp: the kernel may reclaim a few warmed pages).
#include <gtest/gtest.h>

#include "cuda/cuda_resources.hpp"
#include "cuda/gpu_checksum.hpp"
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
    no_gpu_checksum = detail::gpu_checksum_unavailable(0);
  }
  // Page-cache DMA needs the GPU checksum: the tests of what it serves skip without it.
  bool dma_unavailable() const { return !no_gpu_checksum.empty(); }
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
  // Zeroes a destination piece, on the GPU where it lies there.
  void clear(const KVPiece& piece) {
    if (!piece.device.is_cuda()) return clear_host_piece(piece);
    context->make_current();
    detail::Stream stream;
    FERRY_CU(cuMemsetD8Async, reinterpret_cast<shim::cu::DevicePtr>(piece.data), 0, piece.size,
             stream.get());
    stream.synchronize();
  }
  // get_warm (kv_page_cache_support.hpp) into GPU memory: a block whose window was short of
  // pages is got again, its destination cleared on the GPU first.
  std::vector<KVResult> get_warm_to_gpu(KVStore& store, std::span<const KVKey> keys,
                                        std::span<const KVBlock> blocks) {
    return get_warm(store, keys, blocks, [this](const KVPiece& piece) { clear(piece); });
  }
  // One key's block into a fresh device buffer, by get_warm_to_gpu: the result and the bytes
  // that landed.
  std::pair<KVResult, std::vector<std::byte>> get_to_gpu(KVStore& store, KVKey key,
                                                         std::uint64_t size) {
    auto target = device(size);
    KVPiece piece{target.get(), size, Device::cuda(0)};
    KVBlock block(&piece, 1);
    auto result = get_warm_to_gpu(store, std::span(&key, 1), std::span(&block, 1))[0];
    return {result, download(target.get(), size)};
  }
  TempDir dir;
  std::shared_ptr<detail::PrimaryContext> context;
  std::string no_gpu_checksum;  // why the GPU checksum cannot run ("" where it can)
};

#define SKIP_WITHOUT_GPU_CHECKSUM() \
  if (dma_unavailable()) GTEST_SKIP() << "no GPU checksum: " << no_gpu_checksum

TEST_F(GpuKvDma, RoundTripsThroughRegisteredWindowsAreBitExact) {
  SKIP_WITHOUT_GPU_CHECKSUM();
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
    for (int pass = 0; pass < 2; ++pass) {  // registering (in the background), registered
      const auto results = get_warm_to_gpu(store, keys, blocks);
      const auto got = download(memory.get(), n * size);
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(results[i].ok()) << results[i].message;
        EXPECT_EQ(results[i].route, KVRoute::page_cache_dma) << results[i].route_reason;
        EXPECT_TRUE(has(results[i].route_reason, "registered pages")) << results[i].route_reason;
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

// Per-layer K and V pieces land in the bounce buffer, are checked there and scattered; a
// single-piece block of the same get lands in its destination.
TEST_F(GpuKvDma, PerLayerPiecesAreCopiedFromTheWindow) {
  SKIP_WITHOUT_GPU_CHECKSUM();
  // 8 layers x K, V in two device buffers (as a paged cache's K and V tensors) plus an odd tail.
  const std::uint64_t piece = 24 * kKiB + 512, tail = 1000;
  const std::uint64_t size = 16 * piece + tail;
  auto store = open(4 * ((size + 4095) / 4096 * 4096), size);
  const std::vector<KVKey> keys{5, 6};
  for (KVKey key : keys) ASSERT_TRUE(put_one(store, key, kv_bytes(key, size)).ok());
  warm_slab(dir.path());
  const auto bytes = kv_bytes(5, size);
  auto k = device(8 * piece), v = device(8 * piece + tail), whole = device(size);
  std::vector<KVPiece> pieces;
  for (int layer = 0; layer < 8; ++layer) {
    pieces.push_back({static_cast<std::byte*>(k.get()) + layer * piece, piece, Device::cuda(0)});
    pieces.push_back({static_cast<std::byte*>(v.get()) + layer * piece, piece, Device::cuda(0)});
  }
  pieces.push_back({static_cast<std::byte*>(v.get()) + 8 * piece, tail, Device::cuda(0)});
  const KVPiece single{whole.get(), size, Device::cuda(0)};
  const std::vector<KVBlock> blocks{KVBlock(pieces), KVBlock(&single, 1)};
  const auto results = get_warm_to_gpu(store, keys, blocks);
  for (const KVResult& r : results) {
    ASSERT_TRUE(r.ok()) << r.message;
    EXPECT_EQ(r.route, KVRoute::page_cache_dma) << r.route_reason;
    EXPECT_TRUE(has(r.route_reason, "GPU checksum")) << r.route_reason;
  }
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
  EXPECT_EQ(download(whole.get(), size), kv_bytes(6, size));
  EXPECT_EQ(store.stats().page_cache_dma_bytes, 2 * size);
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
  SKIP_WITHOUT_GPU_CHECKSUM();
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
  SKIP_WITHOUT_GPU_CHECKSUM();
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
// through them), the get returns the new bytes. (It once returned the old ones with an OK status,
// when the checksum was taken from the CPU's mapping, which showed the new page while the GPU
// had copied the old pinned one: now the bytes that landed are checked.)
TEST_F(GpuKvDma, AWindowWrittenBehindTheStoreIsReadBackRight) {
  SKIP_WITHOUT_GPU_CHECKSUM();
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

// A window made stale on purpose: slot 1 holds other bytes when the window is registered, then
// its pages are punched out of the page cache (the registration keeps the old ones pinned) and
// key 2's bytes written in fresh pages. The DMA still reads the pinned pages: the GPU checksum
// of what landed finds them stale, the block is re-read from the file, right, and the next get
// registers the window afresh. One piece (checked in the destination) and per-layer pieces
// (checked in the bounce buffer, never scattered).
TEST_F(GpuKvDma, AStaleWindowIsFoundOnTheGpuAndTheBlockReReadRight) {
  SKIP_WITHOUT_GPU_CHECKSUM();
  for (bool pieces : {false, true}) {
    SCOPED_TRACE(pieces ? "per-layer pieces" : "one piece");
    TempDir here;
    const std::uint64_t size = 64 * kKiB;
    auto store =
        KVStore::open(here.path(), kv_namespace(), 4 * size, size, page_cache_options(kPin));
    ASSERT_TRUE(put_one(store, 1, kv_bytes(1, size)).ok());
    ASSERT_TRUE(put_one(store, 2, kv_bytes(2, size)).ok());
    ASSERT_TRUE(write_behind(here.path(), size, slot_image(kv_bytes(9, size)), false));
    warm_slab(here.path());
    const KVResult first = get_to_gpu(store, 1, size).first;
    ASSERT_TRUE(first.ok()) << first.message;
    ASSERT_EQ(first.route, KVRoute::page_cache_dma) << first.route_reason;  // window registered
    if (!replace_behind(here.path(), size, slot_image(kv_bytes(2, size))))
      GTEST_SKIP() << "no hole punching on " << here.path();
    const auto get = [&] {
      auto memory = device(size);
      std::vector<KVPiece> parts;
      const std::uint64_t part = pieces ? size / 8 : size;
      for (std::uint64_t at = 0; at < size; at += part)
        parts.push_back({static_cast<std::byte*>(memory.get()) + at, part, Device::cuda(0)});
      const KVBlock block(parts);
      const KVKey key = 2;
      const KVResult r = get_warm_to_gpu(store, std::span(&key, 1), std::span(&block, 1))[0];
      return std::pair(r, download(memory.get(), size));
    };
    const auto [r, got] = get();
    ASSERT_TRUE(r.ok()) << r.message;
    EXPECT_EQ(got, kv_bytes(2, size));
    EXPECT_NE(r.route, KVRoute::page_cache_dma);
    EXPECT_TRUE(has(r.route_reason, "stale")) << r.route_reason;
    KVStats stats = store.stats();
    EXPECT_EQ(stats.page_cache_stale_rereads, 1u);
    EXPECT_EQ(stats.corrupt_dropped, 0u);
    warm_slab(here.path());
    const auto [again, got_again] = get();
    ASSERT_TRUE(again.ok()) << again.message;
    EXPECT_EQ(again.route, KVRoute::page_cache_dma) << again.route_reason;
    EXPECT_GE(store.stats().page_cache_windows_registered, 2u) << "registered afresh";
    EXPECT_EQ(got_again, kv_bytes(2, size));
    EXPECT_EQ(store.stats().page_cache_stale_rereads, 1u);
  }
}

// Where this build or driver cannot run the GPU checksum, page-cache DMA serves nothing and each
// block says why (runs only there: elsewhere the tests above cover the route).
TEST_F(GpuKvDma, WithoutTheGpuChecksumBlocksTakeTheUsualPathAndSayWhy) {
  if (!dma_unavailable()) GTEST_SKIP() << "the GPU checksum runs here";
  const std::uint64_t size = 64 * kKiB;
  auto store = open(4 * size, size);
  ASSERT_TRUE(put_one(store, 1, kv_bytes(1, size)).ok());
  warm_slab(dir.path());
  const auto [r, got] = get_to_gpu(store, 1, size);
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(got, kv_bytes(1, size));
  EXPECT_EQ(r.route, KVRoute::staged);
  EXPECT_TRUE(has(r.route_reason, "GPU checksum")) << r.route_reason;
  EXPECT_TRUE(has(r.route_reason, no_gpu_checksum.c_str())) << r.route_reason;
  EXPECT_EQ(store.stats().page_cache_windows_registered, 0u);
}

}  // namespace
}  // namespace ferry::test
