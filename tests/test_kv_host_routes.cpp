// The host path's routes for blocks of several pieces that are not all page-aligned: the
// page-aligned ones move straight by O_DIRECT, a short unaligned tail through a page of its
// own, checked before it reaches the caller's memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "kv_host_memory.hpp"
#include "kv_test_support.hpp"

namespace ferry::test {
namespace {

constexpr std::uint64_t kKiB = 1024, kMiB = 1024 * 1024;

// vLLM's KV tier stores a page-aligned chunk with a 128-byte key trailer from elsewhere: the
// chunk moves straight by O_DIRECT and the trailer through a page of its own (no bounce copy
// of the chunk), both ways, cold; a corrupt trailer is a miss whose trailer never reaches the
// caller's memory (checked before it is copied out).
TEST(KvStore, AChunkWithItsKeyTrailerMovesStraightAndItsTailIsCheckedFirst) {
  for (std::uint64_t chunk : {4 * kKiB, 2 * kMiB}) {
    TempDir dir;
    KVStoreOptions options;
    options.slab_count = 1;
    const std::uint64_t size = chunk + 128;
    auto store = KVStore::open(dir.path(), kv_namespace(), 4 * (chunk + 4096), size, options);
    auto in = page_aligned(chunk), out = page_aligned(chunk);
    const auto bytes = kv_bytes(5, size);
    std::memcpy(in.get(), bytes.data(), chunk);
    std::vector<std::byte> trailer_in(131), trailer_out(131, std::byte{0x5A});
    std::memcpy(trailer_in.data() + 3, bytes.data() + chunk, 128);
    const std::vector<KVPiece> from = {{in.get(), chunk}, {trailer_in.data() + 3, 128}},
                               into = {{out.get(), chunk}, {trailer_out.data() + 3, 128}};
    const KVKey key = 5;
    const KVBlock source(from), target(into);
    const KVResult put = store.put(std::span(&key, 1), std::span(&source, 1))[0];
    ASSERT_TRUE(put.ok()) << put.message;
    EXPECT_NE(put.route_reason.find("page of its own"), std::string::npos) << put.route_reason;
    drop_slab_cache(dir.path());
    const KVResult got = store.get(std::span(&key, 1), std::span(&target, 1))[0];
    ASSERT_TRUE(got.ok()) << got.message;
    EXPECT_NE(got.route_reason.find("O_DIRECT read straight into"), std::string::npos)
        << got.route_reason;
    EXPECT_EQ(std::memcmp(out.get(), bytes.data(), chunk), 0) << chunk;
    EXPECT_TRUE(std::equal(trailer_out.begin() + 3, trailer_out.end(), bytes.begin() + chunk));

    const auto slab = dir.path() / KVStore::directory_name(kv_namespace()) / "slab-0.dat";
    {
      std::fstream f(slab, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(chunk + 7));  // slot 0's trailer
      const char c = static_cast<char>(bytes[chunk + 7]) ^ 0x10;
      f.write(&c, 1);
    }
    drop_slab_cache(dir.path());
    std::fill(trailer_out.begin(), trailer_out.end(), std::byte{0x5A});
    EXPECT_EQ(store.get(std::span(&key, 1), std::span(&target, 1))[0].status, KVStatus::missing);
    EXPECT_TRUE(std::all_of(trailer_out.begin(), trailer_out.end(), [](std::byte b) {
      return b == std::byte{0x5A};
    })) << "a corrupt trailer reached the caller";
  }
}

// A block larger than one O_DIRECT call moves in several, the calls' ends falling inside its
// pieces: 12 KiB pieces at a 16 KiB stride (straight, O_DIRECT) with a 100-byte tail, and the
// same bytes from unaligned pieces (through the bounce buffer), both ways, cold, bit-exact.
TEST(KvStore, BlocksLargerThanOneDirectCallMoveWholeInSeveral) {
  constexpr std::uint64_t kPieces = 300, kPiece = 12 * kKiB, kStride = 16 * kKiB, kTail = 100;
  const std::uint64_t size = kPieces * kPiece + kTail;
  for (const bool aligned : {true, false}) {
    TempDir dir;
    auto store = KVStore::open(dir.path(), kv_namespace(), 2 * (size + 4096), size, {});
    const std::uint64_t shift = aligned ? 0 : 8;  // unaligned pieces take the bounce buffer
    auto in = page_aligned(kPieces * kStride + 4096), out = page_aligned(kPieces * kStride + 4096);
    std::vector<std::byte> tail_in(kTail), tail_out(kTail);
    std::vector<KVPiece> from, into;
    for (std::uint64_t p = 0; p < kPieces; ++p) {
      from.push_back({in.get() + shift + p * kStride, kPiece});
      into.push_back({out.get() + shift + p * kStride, kPiece});
    }
    from.push_back({tail_in.data(), kTail});
    into.push_back({tail_out.data(), kTail});
    const auto bytes = kv_bytes(9, size);
    for (std::uint64_t p = 0; p < kPieces; ++p)
      std::memcpy(from[p].data, bytes.data() + p * kPiece, kPiece);
    std::memcpy(tail_in.data(), bytes.data() + kPieces * kPiece, kTail);
    const KVKey key = 9;
    const KVBlock source(from), target(into);
    const KVResult put = store.put(std::span(&key, 1), std::span(&source, 1))[0];
    ASSERT_TRUE(put.ok()) << put.message;
    EXPECT_EQ(put.route_reason.find("bounce") == std::string::npos, aligned) << put.route_reason;
    drop_slab_cache(dir.path());
    const KVResult got = store.get(std::span(&key, 1), std::span(&target, 1))[0];
    ASSERT_TRUE(got.ok()) << got.message;
    EXPECT_NE(got.route_reason.find("O_DIRECT"), std::string::npos) << got.route_reason;
    for (std::uint64_t p = 0; p < kPieces; ++p)
      ASSERT_EQ(std::memcmp(into[p].data, bytes.data() + p * kPiece, kPiece), 0)
          << "piece " << p << (aligned ? " (straight)" : " (bounce)");
    EXPECT_EQ(std::memcmp(tail_out.data(), bytes.data() + kPieces * kPiece, kTail), 0);
  }
}

}  // namespace
}  // namespace ferry::test
