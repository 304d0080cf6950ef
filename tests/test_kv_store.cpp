// The KV block store through its public API: round trips, reopen, eviction, bad input.
#include <gtest/gtest.h>
#ifndef _WIN32
#include <sys/stat.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <thread>

#include "ferry/error.hpp"
#include "kv/slab_files.hpp"
#include "kv/transfer_block_io.hpp"
#include "kv_host_memory.hpp"
#include "kv_test_support.hpp"
#include "platform/file_ops.hpp"
#include "platform/file_ranges.hpp"
#include "platform/system.hpp"

namespace ferry::test {
namespace {

constexpr std::uint64_t kKiB = 1024, kMiB = 1024 * 1024;

// Puts each key's kv_bytes in one batch, gets them back in one batch, compares bit for bit.
void round_trip(KVStore& store, const std::vector<KVKey>& keys, std::size_t size) {
  std::vector<std::vector<std::byte>> in, out;
  std::vector<KVPiece> in_pieces, out_pieces;
  for (KVKey k : keys) {
    in.push_back(kv_bytes(k, size));
    out.emplace_back(size, std::byte{0xAA});
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    in_pieces.push_back({in[i].data(), size});
    out_pieces.push_back({out[i].data(), size});
  }
  std::vector<KVBlock> sources, destinations;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    sources.emplace_back(&in_pieces[i], 1);
    destinations.emplace_back(&out_pieces[i], 1);
  }
  for (const KVResult& r : store.put(keys, sources)) ASSERT_TRUE(r.ok()) << r.message;
  for (const KVResult& r : store.get(keys, destinations)) ASSERT_TRUE(r.ok()) << r.message;
  for (std::size_t i = 0; i < keys.size(); ++i) ASSERT_EQ(in[i], out[i]) << "key " << keys[i];
}

TEST(KvStore, RoundTripsBlockSizesBitExact) {
  std::vector<std::uint64_t> sizes = {4 * kKiB, 4 * kKiB + 100, 64 * kKiB, 1 * kMiB, 16 * kMiB};
  if (std::getenv("FERRY_KV_BIG")) sizes.push_back(64 * kMiB);
  for (std::uint64_t size : sizes) {
    TempDir dir;
    auto store = KVStore::open(dir.path(), kv_namespace(), 3 * ((size + 4095) / 4096 * 4096), size);
    round_trip(store, iota_keys(3), size);
    EXPECT_EQ(store.stats().blocks, 3u);
  }
}

// Host memory by each route the host path takes: one 4 KiB-aligned piece (O_DIRECT straight
// in and out, a partial last page through a page buffer), two page-aligned pieces (one O_DIRECT
// preadv/pwritev), an unaligned piece and two unaligned pieces (bounce buffer); gets cold (page
// cache dropped) and warm (straight from the page cache).
TEST(KvStore, HostBlocksRoundTripByEveryRouteColdAndWarm) {
  for (std::uint64_t size : {4 * kKiB, 4 * kKiB + 100, 64 * kKiB, kMiB + 5, 4 * kMiB}) {
    TempDir dir;
    const std::uint64_t slot = (size + 4095) / 4096 * 4096;
    auto store = KVStore::open(dir.path(), kv_namespace(), 8 * slot, size);
    auto aligned_in = page_aligned(size), aligned_out = page_aligned(size);
    // Pieces at page boundaries where the size allows (else the bounce buffer takes them).
    const std::uint64_t split = size >= 8192 ? size / 2 / 4096 * 4096 : size / 2;
    auto paged_in = page_aligned(size), paged_out = page_aligned(size);
    std::vector<std::byte> unaligned_in(size + 1), unaligned_out(size + 1), two_in(size),
        two_out(size);
    const std::vector<KVKey> keys = {1, 2, 3, 4};
    const auto a = kv_bytes(1, size), b = kv_bytes(2, size), c = kv_bytes(3, size),
               d = kv_bytes(4, size);
    std::memcpy(aligned_in.get(), a.data(), size);
    std::memcpy(paged_in.get(), d.data(), size);
    std::vector<KVPiece> paged_ins = {{paged_in.get(), split},
                                      {paged_in.get() + split, size - split}},
                         paged_outs = {{paged_out.get(), split},
                                       {paged_out.get() + split, size - split}};
    std::memcpy(unaligned_in.data() + 1, b.data(), size);
    std::memcpy(two_in.data(), c.data(), size);
    const std::uint64_t half = size / 2;
    std::vector<KVPiece> ins = {{aligned_in.get(), size}, {unaligned_in.data() + 1, size}},
                         outs = {{aligned_out.get(), size}, {unaligned_out.data() + 1, size}};
    std::vector<KVPiece> two_ins = {{two_in.data(), half}, {two_in.data() + half, size - half}},
                         two_outs = {{two_out.data(), half}, {two_out.data() + half, size - half}};
    const std::vector<KVBlock> sources = {KVBlock(&ins[0], 1), KVBlock(&ins[1], 1), two_ins,
                                          paged_ins},
                               targets = {KVBlock(&outs[0], 1), KVBlock(&outs[1], 1), two_outs,
                                          paged_outs};
    for (const KVResult& r : store.put(keys, sources)) ASSERT_TRUE(r.ok()) << r.message;
    for (bool cold : {true, false}) {
      if (cold) drop_slab_cache(dir.path());
      std::memset(aligned_out.get(), 0xAA, size);
      std::fill(unaligned_out.begin(), unaligned_out.end(), std::byte{0xAA});
      std::fill(two_out.begin(), two_out.end(), std::byte{0xAA});
      std::memset(paged_out.get(), 0xAA, size);
      for (const KVResult& r : store.get(keys, targets)) ASSERT_TRUE(r.ok()) << r.message;
      EXPECT_EQ(std::memcmp(aligned_out.get(), a.data(), size), 0) << size << (cold ? " cold" : "");
      EXPECT_TRUE(std::equal(b.begin(), b.end(), unaligned_out.begin() + 1)) << size;
      EXPECT_EQ(two_out, c) << size;
      EXPECT_EQ(std::memcmp(paged_out.get(), d.data(), size), 0) << size;
      EXPECT_EQ(unaligned_out[0], std::byte{0xAA});  // nothing before the piece
    }
  }
}

// A corrupt byte read cold into the bounce buffer never reaches the caller's memory; read
// straight into aligned memory it is a miss all the same.
TEST(KvStore, CorruptBlocksReadColdAreMissesByEitherRoute) {
  TempDir dir;
  KVStoreOptions options;
  options.slab_count = 1;
  const KVNamespace ns = kv_namespace();
  const std::uint64_t size = 64 * kKiB;
  {
    auto store = KVStore::open(dir.path(), ns, 4 * size, size, options);
    ASSERT_TRUE(put_one(store, 7, kv_bytes(7, size)).ok());  // slot 0
    ASSERT_TRUE(put_one(store, 8, kv_bytes(8, size)).ok());  // slot 1
  }
  const auto slab = dir.path() / KVStore::directory_name(ns) / "slab-0.dat";
  for (std::uint64_t at : {std::uint64_t{1234}, size + 4321}) {
    std::fstream f(slab, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(at));
    c = static_cast<char>(c ^ 0x10);
    f.write(&c, 1);
  }
  drop_slab_cache(dir.path());
  auto store = KVStore::open(dir.path(), ns, 4 * size, size, options);
  auto memory = page_aligned(size + 4096);
  std::byte* out = memory.get() + 16;  // not page-aligned: the bounce buffer
  std::memset(out, 0x5A, size);
  KVPiece unaligned{out, size};
  const KVKey first = 7;
  const KVBlock into(&unaligned, 1);
  EXPECT_EQ(store.get(std::span(&first, 1), std::span(&into, 1))[0].status, KVStatus::missing);
  EXPECT_TRUE(std::all_of(out, out + size, [](std::byte b) { return b == std::byte{0x5A}; }))
      << "bad bytes delivered";
  auto aligned = page_aligned(size);
  KVPiece piece{aligned.get(), size};
  const KVKey key = 8;
  const KVBlock block(&piece, 1);
  const KVResult r = store.get(std::span(&key, 1), std::span(&block, 1))[0];
  EXPECT_EQ(r.status, KVStatus::missing);
  EXPECT_NE(r.message.find("checksum"), std::string::npos) << r.message;
  EXPECT_EQ(store.stats().corrupt_dropped, 2u);
}

// The staged path (the one GPU blocks take) run with host memory through the transfer core:
// blocks of one and of three pieces, 4 KiB to 16 MiB, in one batch whose blocks the workers take
// in rounds: bit-exact cold and warm, each checksum the XXH3-64 of the block's bytes (as the host
// path takes it), and a corrupted byte caught (that block a checksum mismatch, the others ok).
TEST(KvStagedPath, HostBlocksThroughTheCoreRoundTripAndCatchCorruption) {
  using namespace detail::kv;
  TempDir dir;
  const std::uint64_t slot = 16 * kMiB;
  const std::uint64_t sizes[] = {4 * kKiB, 64 * kKiB + 5, kMiB, 5 * kMiB + 4096, 16 * kMiB};
  const std::size_t n = std::size(sizes) * 2;  // each size in one piece, then in three
  SlabFiles slabs(dir.path(), 1, slot * n, true);
  TransferBlockIo io(slabs, slot, true, KVPath::Staged, false, true);
  std::vector<std::vector<std::byte>> data(n), back(n);
  std::vector<std::vector<BlockSpan>> in(n), out(n);
  std::vector<BlockRequest> requests(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t size = sizes[i / 2];
    const unsigned pieces = i % 2 ? 3 : 1;
    data[i] = kv_bytes(i + 1, size);
    back[i].assign(size, std::byte{0xAA});
    const std::uint64_t part = size / pieces;
    for (unsigned p = 0; p < pieces; ++p) {
      const std::uint64_t length = p + 1 == pieces ? size - part * p : part;
      in[i].push_back({data[i].data() + part * p, length});
      out[i].push_back({back[i].data() + part * p, length});
    }
    requests[i].offset = i * slot;
    requests[i].pieces = in[i];
  }
  io.write(requests, nullptr);
  io.sync(0);
  std::vector<std::uint64_t> sums(n);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(requests[i].outcome, BlockOutcome::ok) << requests[i].message;
    EXPECT_EQ(requests[i].route, KVRoute::staged);
    sums[i] = requests[i].checksum;
    EXPECT_EQ(sums[i], kv_key(data[i])) << "block " << i;
  }
  const auto read_all = [&] {
    for (auto& b : back) std::fill(b.begin(), b.end(), std::byte{0xAA});
    for (std::size_t i = 0; i < n; ++i) {
      requests[i] = BlockRequest{};
      requests[i].offset = i * slot;
      requests[i].pieces = out[i];
      requests[i].checksum = sums[i];
    }
    io.read(requests);
  };
  const auto fd = slabs.buffered_fd(0);
  ASSERT_TRUE(detail::sync_data(fd));
  detail::drop_cached_pages(fd);
  for (const char* pass : {"cold", "warm"}) {
    read_all();
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(requests[i].outcome, BlockOutcome::ok) << pass << ": " << requests[i].message;
      EXPECT_TRUE(back[i] == data[i]) << pass << ": block " << i;
    }
  }
  // One byte of block 7 (three pieces, 5 MiB + 4 KiB) flipped, in its second piece.
  const std::uint64_t at = 7 * slot + 3 * kMiB;
  std::byte b{};
  ASSERT_EQ(detail::read_some_at(fd, &b, 1, at), 1);
  b ^= std::byte{0x01};
  ASSERT_EQ(detail::write_some_at(fd, &b, 1, at), 1);
  ASSERT_TRUE(detail::sync_data(fd));  // for a read that goes around the page cache
  read_all();
  for (std::size_t i = 0; i < n; ++i) {
    if (i == 7) {
      EXPECT_EQ(requests[i].outcome, BlockOutcome::checksum_mismatch);
      EXPECT_NE(requests[i].message.find("checksum"), std::string::npos) << requests[i].message;
    } else {
      ASSERT_EQ(requests[i].outcome, BlockOutcome::ok) << requests[i].message;
      EXPECT_TRUE(back[i] == data[i]) << "block " << i;
    }
  }
}

TEST(KvStore, RoundTripsBatchesOfOneToThousands) {
  for (std::size_t batch : {1u, 7u, 1024u}) {
    TempDir dir;
    auto store = KVStore::open(dir.path(), kv_namespace(), 1100 * 4 * kKiB, 4 * kKiB);
    round_trip(store, iota_keys(batch, 1000), 4 * kKiB);
  }
}

TEST(KvStore, PerLayerPiecesAreGatheredAndScattered) {
  TempDir dir;
  // 8 layers x (K, V) of odd sizes: one block of 16 pieces.
  std::vector<std::size_t> piece_sizes;
  for (int layer = 0; layer < 8; ++layer) piece_sizes.push_back(1000 + 37 * layer),
                                          piece_sizes.push_back(999 + 41 * layer);
  std::size_t block = 0;
  for (auto s : piece_sizes) block += s;
  auto store = KVStore::open(dir.path(), kv_namespace(), 16 * 32 * kKiB, block);
  const KVKey key = 42;
  const auto whole = kv_bytes(key, block);
  // Pieces in separate allocations, as paged KV lives.
  std::vector<std::vector<std::byte>> layers;
  std::vector<KVPiece> pieces;
  std::size_t at = 0;
  for (auto s : piece_sizes) {
    layers.emplace_back(whole.begin() + at, whole.begin() + at + s);
    at += s;
  }
  for (auto& l : layers) pieces.push_back({l.data(), l.size()});
  KVBlock source(pieces);
  ASSERT_TRUE(store.put(std::span(&key, 1), std::span(&source, 1))[0].ok());
  // Contiguous get equals the gathered pieces.
  std::vector<std::byte> out(block);
  ASSERT_TRUE(get_one(store, key, out).ok());
  EXPECT_EQ(out, whole);
  // Scattered get into fresh pieces equals each layer.
  std::vector<std::vector<std::byte>> back;
  std::vector<KVPiece> back_pieces;
  for (auto s : piece_sizes) back.emplace_back(s, std::byte{0});
  for (auto& b : back) back_pieces.push_back({b.data(), b.size()});
  KVBlock destination(back_pieces);
  ASSERT_TRUE(store.get(std::span(&key, 1), std::span(&destination, 1))[0].ok());
  EXPECT_EQ(back, layers);
}

TEST(KvStore, ReopenKeepsBlocksWithAndWithoutCheckpoint) {
  for (bool checkpoint : {false, true}) {
    TempDir dir;
    KVStoreOptions options;
    options.checkpoint_on_close = checkpoint;
    const auto keys = iota_keys(20);
    {
      auto store = KVStore::open(dir.path(), kv_namespace(), 32 * 8 * kKiB, 8 * kKiB, options);
      for (KVKey k : keys) ASSERT_TRUE(put_one(store, k, kv_bytes(k, 5000 + k)).ok());
      ASSERT_EQ(store.remove(std::span(&keys[3], 1))[0].status, KVStatus::ok);
    }
    auto store = KVStore::open(dir.path(), kv_namespace(), 32 * 8 * kKiB, 8 * kKiB, options);
    EXPECT_EQ(store.stats().blocks, 19u);
    EXPECT_EQ(store.stats().checkpoints, 0u);
    for (KVKey k : keys) {
      std::vector<std::byte> out(5000 + k);
      const KVResult r = get_one(store, k, out);
      if (k == keys[3]) {
        EXPECT_EQ(r.status, KVStatus::missing);
      } else {
        ASSERT_TRUE(r.ok()) << r.message;
        EXPECT_EQ(out, kv_bytes(k, 5000 + k));
      }
    }
  }
}

TEST(KvStore, LookupCountsTheLeadingHits) {
  TempDir dir;
  auto store = KVStore::open(dir.path(), kv_namespace(), 64 * 4 * kKiB, 4 * kKiB);
  for (KVKey k : iota_keys(10)) ASSERT_TRUE(put_one(store, k, kv_bytes(k, 4096)).ok());
  std::vector<KVKey> prefix = iota_keys(15);
  EXPECT_EQ(store.lookup(prefix), 10u);
  prefix[4] = 999;
  EXPECT_EQ(store.lookup(prefix), 4u);
  EXPECT_EQ(store.lookup({}), 0u);
  const auto present = store.contains(prefix);
  EXPECT_TRUE(present[0]);
  EXPECT_FALSE(present[4]);
  EXPECT_EQ(store.stored_length(1), 4096u);
  EXPECT_EQ(store.stored_length(999), 0u);
  EXPECT_EQ(put_one(store, 1, kv_bytes(1, 4096)).status, KVStatus::already_present);
}

TEST(KvStore, EvictsTheLeastRecentlyUsed) {
  TempDir dir;
  auto store = KVStore::open(dir.path(), kv_namespace(), 8 * 4 * kKiB, 4 * kKiB);
  for (KVKey k : iota_keys(8)) ASSERT_TRUE(put_one(store, k, kv_bytes(k, 4096)).ok());
  std::vector<std::byte> out(4096);
  ASSERT_TRUE(get_one(store, 1, out).ok());  // 1 is now the most recent; 2 the oldest
  ASSERT_TRUE(put_one(store, 100, kv_bytes(100, 4096)).ok());
  EXPECT_TRUE(store.contains(std::vector<KVKey>{1})[0]);
  EXPECT_FALSE(store.contains(std::vector<KVKey>{2})[0]);
  EXPECT_EQ(store.stats().evictions, 1u);
  ASSERT_TRUE(get_one(store, 100, out).ok());
  EXPECT_EQ(out, kv_bytes(100, 4096));
}

TEST(KvStore, EvictionWhileReadsAreInFlightNeverGivesWrongBytes) {
  TempDir dir;
  constexpr std::size_t kBlock = 64 * kKiB;
  auto store = KVStore::open(dir.path(), kv_namespace(), 16 * kBlock, kBlock);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> hits{0};
  std::vector<std::thread> readers;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 3; ++t)
    readers.emplace_back([&, t] {
      std::vector<std::byte> out(kBlock);
      for (KVKey k = t; !stop; k = (k + 7) % 400) {
        const KVResult r = get_one(store, k, out);
        if (r.ok()) {
          ++hits;
          if (out != kv_bytes(k, kBlock)) ++wrong;
        }
      }
    });
  for (KVKey k = 0; k < 400; ++k) ASSERT_TRUE(put_one(store, k, kv_bytes(k, kBlock)).ok());
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_GE(store.stats().evictions, 400u - 16u);
  EXPECT_EQ(store.stats().corrupt_dropped, 0u);  // pins kept read slots from being reused
}

TEST(KvStore, CorruptSlabByteIsCaughtAndDropped) {
  TempDir dir;
  KVStoreOptions options;
  options.slab_count = 1;
  const KVNamespace ns = kv_namespace();
  {
    auto store = KVStore::open(dir.path(), ns, 4 * 4 * kKiB, 4 * kKiB, options);
    ASSERT_TRUE(put_one(store, 7, kv_bytes(7, 4096)).ok());  // slot 0 of slab 0
    ASSERT_TRUE(put_one(store, 8, kv_bytes(8, 4096)).ok());
  }
  const auto slab = dir.path() / KVStore::directory_name(ns) / "slab-0.dat";
  {
    std::fstream f(slab, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1234);
    char c = 0;
    f.read(&c, 1);
    f.seekp(1234);
    c = static_cast<char>(c ^ 0x10);
    f.write(&c, 1);
  }
  auto store = KVStore::open(dir.path(), ns, 4 * 4 * kKiB, 4 * kKiB, options);
  std::vector<std::byte> out(4096, std::byte{0x5A});
  const KVResult r = get_one(store, 7, out);
  EXPECT_EQ(r.status, KVStatus::missing);
  EXPECT_NE(r.message.find("slab-0.dat"), std::string::npos) << r.message;
  // A miss: what the destination holds is undefined (the page-cache read went straight in).
  EXPECT_FALSE(store.contains(std::vector<KVKey>{7})[0]);
  EXPECT_EQ(store.stats().corrupt_dropped, 1u);
  ASSERT_TRUE(get_one(store, 8, out).ok());
  EXPECT_EQ(out, kv_bytes(8, 4096));
}

TEST(KvStore, BadInputGetsClearPerKeyErrors) {
  TempDir dir;
  auto store = KVStore::open(dir.path(), kv_namespace(), 8 * 4 * kKiB, 4 * kKiB);
  std::vector<std::byte> big(4097), good = kv_bytes(1, 4096);
  std::vector<KVPiece> pieces = {{big.data(), big.size()},
                                 {good.data(), good.size()},
                                 {good.data(), 0},
                                 {good.data(), 4096, Device::cuda(0)}};
  std::vector<KVBlock> blocks;
  for (auto& p : pieces) blocks.emplace_back(&p, 1);
  std::vector<KVKey> keys = {10, 11, 12, 13};
  if (cuda_available()) {  // the fourth is a GPU piece without a GPU (test_gpu_kv moves real ones)
    keys.pop_back();
    blocks.pop_back();
  }
  const auto results = store.put(keys, blocks);
  EXPECT_EQ(results[0].status, KVStatus::bad_size);
  EXPECT_NE(results[0].message.find("4097"), std::string::npos);
  EXPECT_TRUE(results[1].ok());  // one bad key does not fail the others
  EXPECT_EQ(results[2].status, KVStatus::bad_size);
  if (results.size() == 4) {
    EXPECT_EQ(results[3].status, KVStatus::unsupported);
    EXPECT_NE(results[3].message.find("cuda:0"), std::string::npos);
  }
  // Get: unknown key, wrong destination size.
  std::vector<std::byte> small(100);
  EXPECT_EQ(get_one(store, 999, good).status, KVStatus::missing);
  EXPECT_EQ(get_one(store, 11, small).status, KVStatus::bad_size);
  EXPECT_EQ(store.remove(std::vector<KVKey>{999})[0].status, KVStatus::missing);
  EXPECT_THROW(store.put(keys, std::span(blocks).first(2)), std::invalid_argument);
  EXPECT_EQ(store.stats().blocks, 1u);
}

TEST(KvStore, OpenRefusesBadArgumentsAndMismatchedStores) {
  TempDir dir;
  EXPECT_THROW(KVStore::open(dir.path(), kv_namespace(), 1 * kMiB, 0), std::invalid_argument);
  EXPECT_THROW(KVStore::open(dir.path(), kv_namespace(), 100, 4096), std::invalid_argument);
  KVNamespace bad_rank = kv_namespace();
  bad_rank.tp_rank = 2;
  EXPECT_THROW(KVStore::open(dir.path(), bad_rank, 1 * kMiB, 4096), std::invalid_argument);
  for (const KVGpuGroups groups : {KVGpuGroups{0, 17, 0}, KVGpuGroups{0, 0, 257}}) {
    KVStoreOptions too_many;
    too_many.gpu_groups = groups;
    try {
      KVStore::open(dir.path(), kv_namespace(), 1 * kMiB, 4096, too_many);
      FAIL() << "gpu_groups " << groups.flights << " flights, " << groups.threads
             << " threads were accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("gpu_groups"), std::string::npos) << e.what();
    }
  }
  { auto store = KVStore::open(dir.path(), kv_namespace(), 1 * kMiB, 4096); }
  try {
    KVStore::open(dir.path(), kv_namespace(), 1 * kMiB, 8192);
    FAIL() << "a different block size was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("manifest.json"), std::string::npos) << e.what();
  }
  // A reader of a namespace nobody created.
  KVStoreOptions reader;
  reader.read_only = true;
  EXPECT_THROW(KVStore::open(dir.path(), kv_namespace("other"), 1 * kMiB, 4096, reader),
               std::system_error);
}

TEST(KvStore, OneWriterPerNamespaceAndPrivateFiles) {
  TempDir dir;
  auto store = KVStore::open(dir.path(), kv_namespace(), 1 * kMiB, 4096);
  try {
    KVStore::open(dir.path(), kv_namespace(), 1 * kMiB, 4096);
    FAIL() << "two writers on one namespace";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("writer.lock"), std::string::npos) << e.what();
  }
  ASSERT_TRUE(put_one(store, 1, kv_bytes(1, 4096)).ok());
  store.checkpoint();
#ifndef _WIN32  // Windows files have access lists, not mode bits
  for (const auto& entry : std::filesystem::directory_iterator(store.stats().directory)) {
    struct stat st {};
    ASSERT_EQ(::stat(entry.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << entry.path();
  }
#endif
  // A reader through the same process sees the writer's commits and cannot write.
  KVStoreOptions reader;
  reader.read_only = true;
  auto view = KVStore::open(dir.path(), kv_namespace(), 1 * kMiB, 4096, reader);
  EXPECT_EQ(view.lookup(std::vector<KVKey>{1}), 1u);
  EXPECT_EQ(put_one(view, 2, kv_bytes(2, 4096)).status, KVStatus::read_only);
  ASSERT_TRUE(put_one(store, 2, kv_bytes(2, 4096)).ok());
  std::vector<std::byte> out(4096);
  ASSERT_TRUE(get_one(view, 2, out).ok());
  EXPECT_EQ(out, kv_bytes(2, 4096));
}

// A reader open across the writer's checkpoints: each replaces the journal (renamed over the
// one the writer and the reader hold; Windows refuses the classic rename there) and the reader
// follows it to the new one (another inode; the file index on Windows).
TEST(KvStore, ReaderFollowsTheWriterAcrossCheckpoints) {
  TempDir dir;
  KVStoreOptions options;
  options.checkpoint_every = 3;
  auto store = KVStore::open(dir.path(), kv_namespace(), 64 * 4096, 4096, options);
  KVStoreOptions reader;
  reader.read_only = true;
  auto view = KVStore::open(dir.path(), kv_namespace(), 64 * 4096, 4096, reader);
  std::vector<std::byte> out(4096);
  for (KVKey k = 1; k <= 10; ++k) {
    ASSERT_TRUE(put_one(store, k, kv_bytes(k, 4096)).ok());
    ASSERT_TRUE(get_one(view, k, out).ok()) << "key " << k;
    EXPECT_EQ(out, kv_bytes(k, 4096)) << "key " << k;
  }
  EXPECT_GE(store.stats().checkpoints, 3u);
  store.checkpoint();
  ASSERT_TRUE(get_one(view, 1, out).ok());
  EXPECT_EQ(out, kv_bytes(1, 4096));
}

// A root whose name is not ASCII (UTF-16 on Windows): created, written, reopened, listed.
TEST(KvStore, NonAsciiRootRoundTripsAndReopens) {
  TempDir dir;
  const auto root = dir.path() / std::filesystem::path(u8"kv-キャッシュ-é");
  {
    auto store = KVStore::open(root, kv_namespace(), 16 * 8 * kKiB, 8 * kKiB);
    round_trip(store, iota_keys(12), 8 * kKiB);
  }
  auto store = KVStore::open(root, kv_namespace(), 16 * 8 * kKiB, 8 * kKiB);
  EXPECT_EQ(store.lookup(iota_keys(12)), 12u);
  std::vector<std::byte> out(8 * kKiB);
  ASSERT_TRUE(get_one(store, 5, out).ok());
  EXPECT_EQ(out, kv_bytes(5, 8 * kKiB));
  EXPECT_EQ(KVStore::list(root).size(), 1u);
}

TEST(KvStore, TwoNamespacesOnOneRootNeverShareABlock) {
  TempDir dir;
  auto a = KVStore::open(dir.path(), kv_namespace("model-a", 0), 1 * kMiB, 4096);
  auto b = KVStore::open(dir.path(), kv_namespace("model-a", 1), 1 * kMiB, 4096);
  EXPECT_NE(a.stats().directory, b.stats().directory);
  ASSERT_TRUE(put_one(a, 5, kv_bytes(5, 4096)).ok());
  EXPECT_EQ(b.lookup(std::vector<KVKey>{5}), 0u);
  ASSERT_TRUE(put_one(b, 5, kv_bytes(6, 4096)).ok());
  std::vector<std::byte> out(4096);
  ASSERT_TRUE(get_one(a, 5, out).ok());
  EXPECT_EQ(out, kv_bytes(5, 4096));
  ASSERT_TRUE(get_one(b, 5, out).ok());
  EXPECT_EQ(out, kv_bytes(6, 4096));
  // The manifest names the namespace in words.
  std::ifstream manifest(a.stats().directory / "manifest.json");
  std::string text((std::istreambuf_iterator<char>(manifest)), {});
  EXPECT_NE(text.find("model-a"), std::string::npos);
}

TEST(KvStore, ListFindsEveryStoreAndItOpensAgain) {
  TempDir dir;
  KVStoreOptions three_slabs;
  three_slabs.slab_count = 3;
  {
    auto a = KVStore::open(dir.path(), kv_namespace("a"), 10 * 4096, 4096, three_slabs);
    auto b = KVStore::open(dir.path(), kv_namespace("b"), 20 * 8192, 8192);
    ASSERT_TRUE(put_one(a, 1, kv_bytes(1, 4096)).ok());
  }
  const auto stores = KVStore::list(dir.path());
  ASSERT_EQ(stores.size(), 2u);
  for (const KVStoreInfo& info : stores) {
    // Default options (4 slabs): an existing store keeps the 3 it was made with.
    auto store = KVStore::open(dir.path(), info.ns, info.capacity_bytes, info.block_bytes);
    EXPECT_EQ(store.stats().directory, info.directory);
    EXPECT_EQ(store.stats().blocks, info.ns.model == "a" ? 1u : 0u);
  }
  EXPECT_THROW(KVStore::list(dir.path() / "none"), std::system_error);
}

TEST(KvStore, PeriodicCheckpointsTruncateTheJournal) {
  TempDir dir;
  KVStoreOptions options;
  options.checkpoint_every = 10;
  options.checkpoint_on_close = false;
  {
    auto store = KVStore::open(dir.path(), kv_namespace(), 64 * 4 * kKiB, 4096, options);
    for (KVKey k : iota_keys(25)) ASSERT_TRUE(put_one(store, k, kv_bytes(k, 4096)).ok());
    const KVStats stats = store.stats();
    EXPECT_EQ(stats.checkpoints, 2u);
    EXPECT_EQ(stats.journal_records, 5u);
    EXPECT_EQ(std::filesystem::file_size(stats.directory / "journal"), 32u + 5 * 56);
  }
  auto store = KVStore::open(dir.path(), kv_namespace(), 64 * 4 * kKiB, 4096, options);
  EXPECT_EQ(store.stats().blocks, 25u);
  EXPECT_EQ(store.keys(), iota_keys(25));  // the LRU order survives
}

}  // namespace
}  // namespace ferry::test
