// The KV store's asynchronous puts and gets (per-key results, one callback per batch, batches
// finished by closing the store) and its paths, parsed by name and reported in stats.
#include <gtest/gtest.h>

#include <atomic>

#include "ferry/error.hpp"
#include "kv_test_support.hpp"

namespace ferry::test {
namespace {

constexpr std::uint64_t kKiB = 1024;

TEST(KvStoreAsync, PutAndGetAsyncReportPerKeyAndCallBackOnce) {
  TempDir dir;
  auto store = KVStore::open(dir.path(), kv_namespace(), 64 * 8 * kKiB, 8 * kKiB);
  std::vector<KVKey> keys = iota_keys(20, 300);
  std::vector<std::vector<std::byte>> in, out;
  KVBlockList sources, destinations;
  for (KVKey k : keys) {
    in.push_back(kv_bytes(k, 8 * kKiB));
    out.emplace_back(8 * kKiB, std::byte{0});
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    // Two pieces per block: halves gathered into one write.
    sources.push_back({{in[i].data(), 4 * kKiB}, {in[i].data() + 4 * kKiB, 4 * kKiB}});
    destinations.push_back({{out[i].data(), 8 * kKiB}});
  }
  std::atomic<int> calls{0};
  std::vector<KVResult> seen;
  KVTicket put = store.put_async(keys, sources, {}, [&](const std::vector<KVResult>& r) {
    seen = r;
    ++calls;
  });
  put.wait();
  EXPECT_TRUE(put.ready());
  EXPECT_EQ(calls.load(), 1);
  ASSERT_EQ(seen.size(), keys.size());
  for (const KVResult& r : put.results()) {
    EXPECT_TRUE(r.ok()) << r.message;
    EXPECT_EQ(r.route, KVRoute::host);
  }
  // A miss and a bad size among hits: per-key status.
  keys.push_back(999999);
  destinations.push_back({{out[0].data(), 8 * kKiB}});
  keys.push_back(300);
  std::vector<std::byte> small(100);
  destinations.push_back({{small.data(), small.size()}});
  KVTicket get = store.get_async(keys, destinations);
  ASSERT_TRUE(get.wait_for(60));
  const auto& results = get.results();
  ASSERT_EQ(results.size(), keys.size());
  for (std::size_t i = 0; i < 20; ++i) {
    EXPECT_TRUE(results[i].ok()) << results[i].message;
    EXPECT_EQ(out[i], in[i]);
  }
  EXPECT_EQ(results[20].status, KVStatus::missing);
  EXPECT_EQ(results[20].route, KVRoute::none);
  EXPECT_EQ(results[21].status, KVStatus::bad_size);
  EXPECT_THROW(store.put_async({1, 2}, {{}}), std::invalid_argument);
}

// Many batches in flight at once, the store closed while they run: every one completes first.
TEST(KvStoreAsync, ClosingTheStoreFinishesItsBatches) {
  TempDir dir;
  std::vector<std::vector<std::byte>> in;
  std::vector<KVTicket> tickets;
  std::atomic<int> calls{0};
  {
    auto store = KVStore::open(dir.path(), kv_namespace(), 256 * 4 * kKiB, 4 * kKiB);
    for (KVKey k = 1; k <= 64; ++k) in.push_back(kv_bytes(k, 4 * kKiB));
    for (KVKey k = 1; k <= 64; ++k)
      tickets.push_back(store.put_async({k}, {{{in[k - 1].data(), 4 * kKiB}}}, {},
                                        [&](const std::vector<KVResult>&) { ++calls; }));
  }
  EXPECT_EQ(calls.load(), 64);
  for (const auto& t : tickets) EXPECT_TRUE(t.results()[0].ok()) << t.results()[0].message;
  auto store = KVStore::open(dir.path(), kv_namespace(), 256 * 4 * kKiB, 4 * kKiB);
  EXPECT_EQ(store.stats().blocks, 64u);
}

// A producer's event is honoured for host sources too; without a CUDA driver it cannot be, and
// the put says so rather than reading memory a copy may still fill.
TEST(KvStorePaths, AProducerEventWithoutCudaFailsThePutClearly) {
  if (cuda_available()) GTEST_SKIP() << "test_gpu_kv orders puts after real events";
  TempDir dir;
  auto store = KVStore::open(dir.path(), kv_namespace(), 8 * 4 * kKiB, 4 * kKiB);
  const auto bytes = kv_bytes(1, 4096);
  KVPiece piece{const_cast<std::byte*>(bytes.data()), bytes.size()};
  KVBlock block(&piece, 1);
  const KVKey key = 1;
  int fake_event = 0;
  KVPutOptions options;
  options.after_event = &fake_event;
  const auto results = store.put(std::span(&key, 1), std::span(&block, 1), options);
  EXPECT_EQ(results[0].status, KVStatus::io_error);
  EXPECT_NE(results[0].message.find("no CUDA driver is usable"), std::string::npos)
      << results[0].message;
  EXPECT_EQ(store.stats().blocks, 0u);
  EXPECT_TRUE(store.put(std::span(&key, 1), std::span(&block, 1))[0].ok());
}

TEST(KvStorePaths, ParsedByNameAndReportedInStats) {
  EXPECT_EQ(parse_kv_path("auto"), KVPath::Auto);
  EXPECT_EQ(parse_kv_path("staged"), KVPath::Staged);
  EXPECT_EQ(parse_kv_path("direct"), KVPath::Direct);
  EXPECT_THROW(parse_kv_path("fast"), std::invalid_argument);
  EXPECT_STREQ(to_string(KVRoute::cufile_compat), "cufile-compat");
  TempDir dir;
  KVStoreOptions options;
  options.gpu_path = KVPath::Staged;
  auto store = KVStore::open(dir.path(), kv_namespace(), 8 * 4 * kKiB, 4 * kKiB, options);
  EXPECT_EQ(store.stats().gpu_path, KVPath::Staged);
}

}  // namespace
}  // namespace ferry::test
