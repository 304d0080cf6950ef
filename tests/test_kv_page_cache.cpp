// KV gets by page-cache DMA (KVStoreOptions::page_cache_pin_bytes, kv/page_cache_gets.hpp)
// through the real registry and store, with a host stand-in for the driver: it serves host
// memory (copies are memcpys out of the registered mapping) and, in "pinning" mode, copies
// each range at registration, as the pages a registration pins keep their bytes when a write
// goes around the page cache. Checked: bit-exact round trips (4 KiB..16 MiB, per-layer pieces),
// the route and reason per key, a put into a registered window, a corrupt slab byte (a miss), a
// window written behind the store (re-read right), the budget's LRU eviction, host memory on
// the host path where the registrar serves only GPUs. Each block is checked where it landed
// (the destination, or the bounce buffer of a multi-piece block, scattered only once it
// matched), never in the mapping. Gets expected to find their window warm go through get_warm:
// the kernel may reclaim a few warmed pages before the get looks (kv_page_cache_support.hpp).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <thread>
#include <memory>
#include <mutex>

#include "ferry/machine.hpp"
#include "kv_page_cache_support.hpp"
#include "platform/file_mapping.hpp"
#include "services/page_cache_registry.hpp"

namespace ferry::test {
namespace {

constexpr std::uint64_t kKiB = 1024, kMiB = 1024 * 1024;

struct StandIn {
  bool pinning = false;       // copies read a copy taken at registration
  bool serves_host = true;    // else only cuda:N, as the CUDA driver's
  std::atomic<int> registered = 0, unregistered = 0;
  std::function<void()> while_registering;  // runs inside each registration
  std::mutex mutex;
  std::map<const std::byte*, std::unique_ptr<std::byte[]>> copies;

  detail::PageCacheRegistrar registrar() {
    detail::PageCacheRegistrar r;
    r.name = "host stand-in";
    r.serves = [this](const Device& d) { return serves_host ? !d.is_cuda() : d.is_cuda(); };
    r.register_range = [this](const std::byte* data, std::uint64_t size) {
      if (pinning) {  // the pages as they are when registering starts
        auto copy = std::make_unique<std::byte[]>(size);
        std::memcpy(copy.get(), data, size);
        std::lock_guard lock(mutex);
        copies[data] = std::move(copy);
      }
      if (while_registering) while_registering();
      ++registered;
    };
    r.unregister_range = [this](const std::byte* data) {
      std::lock_guard lock(mutex);
      copies.erase(data);
      ++unregistered;
    };
    if (pinning)
      r.view = [this](const std::byte* data, std::uint64_t) {
        std::lock_guard lock(mutex);
        return copies.at(data).get();
      };
    return r;
  }
};

bool has(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

class KvPageCache : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!detail::file_mapping_supported()) GTEST_SKIP() << "no file mappings on this platform";
  }
  // The process's registry over `driver` (configured first) until the test ends.
  void use() {
    scoped.reset();  // the one before restores the process's own as it goes
    scoped = std::make_unique<detail::ScopedPageCacheRegistry>(driver.registrar());
  }
  KVStore open(std::uint64_t capacity, std::uint64_t block, std::uint64_t pin = 1ull << 30) {
    return KVStore::open(dir.path(), kv_namespace(), capacity, block, page_cache_options(pin));
  }
  // A store of two slots (the third put takes the first's) holding keys 1 and 2, its slab read
  // into the page cache.
  KVStore two_slots_full(std::uint64_t size) {
    auto store = open(2 * size, size);
    EXPECT_TRUE(put_one(store, 1, kv_bytes(1, size)).ok());
    EXPECT_TRUE(put_one(store, 2, kv_bytes(2, size)).ok());
    warm_slab(dir.path());
    return store;
  }
  TempDir dir;
  StandIn driver;  // outlives the registry, which unregisters through it
  std::unique_ptr<detail::ScopedPageCacheRegistry> scoped;
};

TEST_F(KvPageCache, RoundTripsThroughRegisteredWindowsAreBitExact) {
  use();
  for (std::uint64_t size : {4 * kKiB, 4 * kKiB + 100, 256 * kKiB, 1 * kMiB, 16 * kMiB}) {
    SCOPED_TRACE(size);
    TempDir here;
    const std::size_t n = size > kMiB ? 5 : 8;  // 16 MiB: two windows of four slots
    auto store = KVStore::open(here.path(), kv_namespace(), n * ((size + 4095) / 4096 * 4096),
                               size, page_cache_options(1ull << 30));
    std::vector<KVKey> keys;
    for (std::size_t i = 0; i < n; ++i) {
      keys.push_back(100 + i);
      ASSERT_TRUE(put_one(store, keys.back(), kv_bytes(keys.back(), size)).ok());
    }
    warm_slab(here.path());
    std::vector<std::vector<std::byte>> out(n, std::vector<std::byte>(size));
    std::vector<KVPiece> pieces;
    for (auto& o : out) pieces.push_back({o.data(), size});
    std::vector<KVBlock> blocks;
    for (const KVPiece& p : pieces) blocks.emplace_back(&p, 1);
    for (int pass = 0; pass < 2; ++pass) {  // registering (in the background), registered
      for (auto& o : out) std::fill(o.begin(), o.end(), std::byte{0});
      const auto results = get_warm(store, keys, blocks);
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(results[i].ok()) << results[i].message;
        EXPECT_EQ(results[i].route, KVRoute::page_cache_dma) << results[i].route_reason;
        EXPECT_TRUE(has(results[i].route_reason, "registered pages")) << results[i].route_reason;
        EXPECT_EQ(out[i], kv_bytes(keys[i], size)) << i;
      }
    }
    const KVStats stats = store.stats();
    EXPECT_EQ(stats.page_cache_dma_bytes, 2 * n * size);
    EXPECT_EQ(stats.page_cache_windows_registered, size > kMiB ? 2u : 1u);
    EXPECT_EQ(stats.page_cache_windows_pending, 0u);
    EXPECT_EQ(stats.page_cache_stale_rereads, 0u);
    EXPECT_EQ(stats.page_cache_pin_bytes, 1ull << 30);
  }
}

TEST_F(KvPageCache, PerLayerPiecesAreScatteredFromTheWindow) {
  use();
  const std::uint64_t piece = 12 * kKiB + 36, size = 32 * piece + 1000;
  auto store = open(4 * ((size + 4095) / 4096 * 4096), size);
  const auto bytes = kv_bytes(3, size);
  ASSERT_TRUE(put_one(store, 3, bytes).ok());
  warm_slab(dir.path());
  std::vector<std::vector<std::byte>> layers(33);
  std::vector<KVPiece> pieces;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    layers[i].resize(i < 32 ? piece : 1000);
    pieces.push_back({layers[i].data(), layers[i].size()});
  }
  KVBlock block(pieces);
  const KVKey key = 3;
  const auto r = get_warm(store, std::span(&key, 1), std::span(&block, 1))[0];
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(r.route, KVRoute::page_cache_dma) << r.route_reason;
  std::vector<std::byte> joined;
  for (const auto& l : layers) joined.insert(joined.end(), l.begin(), l.end());
  EXPECT_EQ(joined, bytes);
}

TEST_F(KvPageCache, AWindowNotInThePageCacheTakesTheUsualPathAndSaysWhy) {
  use();
  const std::uint64_t size = 64 * kKiB;
  auto store = open(16 * size, size);
  ASSERT_TRUE(put_one(store, 1, kv_bytes(1, size)).ok());
  {
    const int fd = ::open(slab_path(dir.path()).c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  if (page_cache_fraction(slab_path(dir.path())) >= 1.0)
    GTEST_SKIP() << "this file system keeps the slab in memory (tmpfs)";
  std::vector<std::byte> out(size);
  const auto r = get_one(store, 1, out);
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(r.route, KVRoute::host);
  EXPECT_TRUE(has(r.route_reason, "not fully in the page cache")) << r.route_reason;
  EXPECT_EQ(out, kv_bytes(1, size));
  EXPECT_EQ(driver.registered, 0);
}

TEST_F(KvPageCache, HostMemoryTakesTheHostPathWhereTheRegistrarServesOnlyGpus) {
  driver.serves_host = false;
  use();
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
  EXPECT_EQ(driver.registered, 0);
}

// The registration of a window runs on the store's own thread: the get that found the window
// resident takes the usual path, saying so, while the registration is held up; the next get copies
// from the window. A put into the window while its registration runs waits for it and then
// releases it (the stand-in pins: a window kept registered across the put would serve the
// evicted block's bytes, found stale).
TEST_F(KvPageCache, AGetNeverWaitsForARegistrationAndAPutWaitsForOneInItsWindow) {
  driver.pinning = true;
  std::promise<void> entered, go_on;
  std::shared_future<void> released = go_on.get_future().share();
  std::atomic<bool> first = true;
  driver.while_registering = [&] {
    if (first.exchange(false)) {
      entered.set_value();
      released.wait();
    }
  };
  use();
  const std::uint64_t size = 64 * kKiB;
  auto store = two_slots_full(size);
  std::vector<std::byte> out(size);
  const auto r = get_one(store, 1, out);  // returns while the registration is held up
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_NE(r.route, KVRoute::page_cache_dma);
  EXPECT_TRUE(window_was_registering(r)) << r.route_reason;
  EXPECT_EQ(out, kv_bytes(1, size));
  entered.get_future().wait();
  EXPECT_EQ(store.stats().page_cache_windows_pending, 1u);
  auto put = std::async(std::launch::async,
                        [&] { return put_one(store, 3, kv_bytes(3, size)).ok(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the put reaches its window
  go_on.set_value();
  ASSERT_TRUE(put.get());
  wait_for_registrations(store);
  warm_slab(dir.path());
  for (KVKey key : {3, 1}) {  // the get made 1 the newer: the put evicted 2
    const auto got = get_one_warm(store, key, out);
    ASSERT_TRUE(got.ok()) << key << ": " << got.message;
    EXPECT_EQ(out, kv_bytes(key, size)) << key;
    EXPECT_EQ(got.route, KVRoute::page_cache_dma) << got.route_reason;
  }
  EXPECT_EQ(store.stats().page_cache_stale_rereads, 0u);
  EXPECT_GE(driver.unregistered, 1) << "the put released the window registered before it";
}

// Puts and gets from two threads at once while windows are registered in the background (the
// pinning stand-in: a window registered across a put would serve the evicted block's bytes):
// every hit is its key's bytes and no window is ever found stale.
TEST_F(KvPageCache, PutsAndGetsAtOnceWithBackgroundRegistrationsStayCoherent) {
  driver.pinning = true;
  use();
  const std::uint64_t size = 1 << 20;  // 1 MiB slots: a window holds 64 of the store's 128
  auto store = open(128 * size, size);
  constexpr KVKey kKeys = 200;  // more than the slots: puts evict and rewrite every window
  std::atomic<bool> writing{true};
  std::atomic<int> wrong{0}, hits{0}, dma{0};
  std::thread reader([&] {
    std::vector<std::byte> out(size);
    for (KVKey key = 1; writing || key % 50 != 0; ++key) {
      if (key % 25 == 0) warm_slab(dir.path());
      const KVKey asked = 1 + key % kKeys;
      const auto r = get_one(store, asked, out);
      if (!r.ok()) continue;  // evicted, or not put yet
      ++hits;
      if (r.route == KVRoute::page_cache_dma) ++dma;
      if (out != kv_bytes(asked, size)) ++wrong;
    }
  });
  // The first put that failed, checked once the reader is joined. A key of the second pass may
  // still be present: the reader's hits make keys newer, so eviction order follows them.
  std::string failed_put;
  for (int pass = 0; pass < 2 && failed_put.empty(); ++pass)
    for (KVKey key = 1; key <= kKeys && failed_put.empty(); ++key)
      if (const auto r = put_one(store, key, kv_bytes(key, size));
          !r.ok() && r.status != KVStatus::already_present)
        failed_put = std::to_string(key) + ": " + to_string(r.status) + ": " + r.message;
  writing = false;
  reader.join();
  EXPECT_EQ(failed_put, "");
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(hits, 0);
  EXPECT_EQ(store.stats().page_cache_stale_rereads, 0u);
  // Whether DMA served some depends on timing (a window registered between two puts into it);
  // the bytes do not. Run without the puts releasing their windows, this test finds stale ones.
  RecordProperty("dma_hits", dma.load());
}

// The stand-in pins: without the put releasing the window first, the get would copy the
// window's bytes as registered (the evicted block's) and find them stale.
TEST_F(KvPageCache, APutIntoARegisteredWindowThenAGetReturnsTheNewBytes) {
  driver.pinning = true;
  use();
  const std::uint64_t size = 64 * kKiB;
  auto store = two_slots_full(size);
  std::vector<std::byte> out(size);
  for (KVKey key : {1, 2}) {
    const auto r = get_one_warm(store, key, out);
    ASSERT_TRUE(r.ok()) << r.message;
    EXPECT_EQ(r.route, KVRoute::page_cache_dma) << r.route_reason;
  }
  EXPECT_EQ(driver.registered, 1);
  ASSERT_TRUE(put_one(store, 3, kv_bytes(3, size)).ok());
  EXPECT_EQ(driver.unregistered, 1) << "the put released the window it wrote into";
  warm_slab(dir.path());
  for (KVKey key : {3, 2}) {
    const auto r = get_one_warm(store, key, out);
    ASSERT_TRUE(r.ok()) << key << ": " << r.message;
    EXPECT_EQ(out, kv_bytes(key, size)) << key;
    EXPECT_EQ(r.route, KVRoute::page_cache_dma) << r.route_reason;
  }
  EXPECT_EQ(store.stats().page_cache_stale_rereads, 0u);
  EXPECT_FALSE(store.contains(std::vector<KVKey>{1})[0]);
}

// Corrupted before the window is registered (both the window and the file are bad) and after
// (the mapping shows the change): a miss either way, never a hit. Where the get of the corrupt
// block found its window short of pages the test had warmed (window_was_short_of_pages), the
// usual path read the file and found the corruption (a miss too) but page-cache DMA was never
// tried; the block is gone by then, so the case runs again from a fresh store.
TEST_F(KvPageCache, ACorruptSlabByteIsAMiss) {
  const auto corrupt_then_get = [&](bool registered_first, bool last_attempt,
                                    bool& short_of_pages) {
    use();
    TempDir here;
    const std::uint64_t size = 64 * kKiB;
    auto store = KVStore::open(here.path(), kv_namespace(), 4 * size, size,
                               page_cache_options(1ull << 30));
    ASSERT_TRUE(put_one(store, 1, kv_bytes(1, size)).ok());
    ASSERT_TRUE(put_one(store, 2, kv_bytes(2, size)).ok());
    std::vector<std::byte> out(size);
    if (registered_first) {
      warm_slab(here.path());
      ASSERT_EQ(get_one_warm(store, 1, out).route, KVRoute::page_cache_dma);
    }
    auto bad = slot_image(kv_bytes(1, size));
    bad[4321] ^= std::byte{0x40};
    ASSERT_TRUE(write_behind(here.path(), 0, bad, false));
    warm_slab(here.path());
    const auto r = get_one(store, 1, out);
    EXPECT_EQ(r.status, KVStatus::missing) << to_string(r.route);
    EXPECT_TRUE(has(r.message, "checksum")) << r.message;
    const KVStats stats = store.stats();
    EXPECT_EQ(stats.corrupt_dropped, 1u);
    EXPECT_FALSE(store.contains(std::vector<KVKey>{1})[0]);
    if (window_was_short_of_pages(r) && !last_attempt) {
      short_of_pages = true;
      return;
    }
    // Registered first: the DMA path found the mismatch and the file decided; else the usual
    // path read the file (the window was only asked for) and found it.
    EXPECT_EQ(stats.page_cache_stale_rereads, registered_first ? 1u : 0u) << r.route_reason;
    // The window's other block is still served, from a window registered afresh.
    warm_slab(here.path());
    const auto other = get_one_warm(store, 2, out);
    ASSERT_TRUE(other.ok()) << other.message;
    EXPECT_EQ(other.route, KVRoute::page_cache_dma) << other.route_reason;
    EXPECT_EQ(out, kv_bytes(2, size));
  };
  for (bool registered_first : {false, true}) {
    SCOPED_TRACE(registered_first);
    for (int attempt = 1; attempt <= kWarmGetAttempts; ++attempt) {
      bool short_of_pages = false;
      corrupt_then_get(registered_first, attempt == kWarmGetAttempts, short_of_pages);
      if (HasFatalFailure() || !short_of_pages) break;
    }
  }
}

// Another writer changes a slot of a registered window (the pinning stand-in keeps the old
// bytes, as pinned pages stay when a write goes around them): the DMA path's checksum fails,
// the window is dropped and the block re-read from the file, right.
TEST_F(KvPageCache, AWindowChangedByAnotherWriterIsReReadCorrectly) {
  driver.pinning = true;
  use();
  const std::uint64_t size = 64 * kKiB;
  auto store = open(4 * size, size);
  ASSERT_TRUE(put_one(store, 1, kv_bytes(1, size)).ok());
  ASSERT_TRUE(put_one(store, 2, kv_bytes(2, size)).ok());
  ASSERT_TRUE(write_behind(dir.path(), size, slot_image(kv_bytes(9, size)), false));
  warm_slab(dir.path());
  std::vector<std::byte> out(size);
  ASSERT_EQ(get_one_warm(store, 1, out).route, KVRoute::page_cache_dma);  // registers the window
  ASSERT_TRUE(write_behind(dir.path(), size, slot_image(kv_bytes(2, size)), false));
  const auto r = get_one(store, 2, out);
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(out, kv_bytes(2, size));
  EXPECT_NE(r.route, KVRoute::page_cache_dma);
  EXPECT_TRUE(has(r.route_reason, "stale")) << r.route_reason;
  EXPECT_EQ(store.stats().page_cache_stale_rereads, 1u);
  EXPECT_EQ(driver.unregistered, 1);
  EXPECT_EQ(store.stats().corrupt_dropped, 0u);
  // Registered afresh at the next warm get, with the new bytes.
  warm_slab(dir.path());
  const auto again = get_one_warm(store, 2, out);
  ASSERT_TRUE(again.ok()) << again.message;
  EXPECT_EQ(again.route, KVRoute::page_cache_dma) << again.route_reason;
  EXPECT_EQ(driver.registered, 2);
  EXPECT_EQ(out, kv_bytes(2, size));
}

// Three stores of one window each (a 256 KiB slab is one window), a budget of two windows:
// the least recently used idle window goes.
TEST_F(KvPageCache, TheBudgetEvictsTheLeastRecentlyUsedWindow) {
  use();
  const std::uint64_t size = 64 * kKiB, pin = 8 * size;
  TempDir a, b, c;
  std::vector<KVStore> stores;
  for (const TempDir* d : {&a, &b, &c}) {
    stores.push_back(
        KVStore::open(d->path(), kv_namespace(), 4 * size, size, page_cache_options(pin)));
    ASSERT_TRUE(put_one(stores.back(), 1, kv_bytes(1, size)).ok());
    warm_slab(d->path());
  }
  std::vector<std::byte> out(size);
  const auto get = [&](std::size_t s) {
    const auto r = get_one_warm(stores[s], 1, out);
    EXPECT_TRUE(r.ok()) << r.message;
    EXPECT_EQ(out, kv_bytes(1, size));
    return r;
  };
  ASSERT_EQ(get(0).route, KVRoute::page_cache_dma);
  ASSERT_EQ(get(1).route, KVRoute::page_cache_dma);
  ASSERT_EQ(get(0).route, KVRoute::page_cache_dma);  // a's window is now the newer
  EXPECT_EQ(scoped->registry().registered_bytes(), pin);
  ASSERT_EQ(get(2).route, KVRoute::page_cache_dma);  // evicts b's
  EXPECT_EQ(driver.unregistered, 1);
  EXPECT_EQ(scoped->registry().registrations(), 2u);
  EXPECT_EQ(get(0).route, KVRoute::page_cache_dma);
  EXPECT_EQ(driver.registered, 3);
  EXPECT_EQ(get(1).route, KVRoute::page_cache_dma);  // registered again, evicting c's
  EXPECT_EQ(driver.registered, 4);
  // A budget smaller than a window: the usual path, saying so.
  TempDir d;
  auto small = KVStore::open(d.path(), kv_namespace(), 4 * size, size, page_cache_options(size));
  ASSERT_TRUE(put_one(small, 1, kv_bytes(1, size)).ok());
  warm_slab(d.path());
  const auto r = get_one(small, 1, out);
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(r.route, KVRoute::host);
  EXPECT_TRUE(has(r.route_reason, "larger than the budget")) << r.route_reason;
}

}  // namespace
}  // namespace ferry::test
