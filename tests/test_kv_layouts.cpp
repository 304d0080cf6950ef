// The engines' paged KV layouts (kv_layouts.hpp) through the store in host memory: every block's
// pieces are slices of per-layer cache tensors; put from them and get back into fresh tensors,
// into one contiguous buffer and from one, sync and async, tensors page-aligned and misaligned
// by 64 bytes (torch's CPU alignment): bit-exact, and no byte outside the block's pieces touched.
// Bad input: pieces that do not add up to the block, overlapping pieces, a GPU piece here.
#include <gtest/gtest.h>

#include <cstring>

#include "ferry/device.hpp"
#include "kv_layouts.hpp"
#include "kv_test_support.hpp"

namespace ferry::test {
namespace {

// The layout's cache tensors in host memory, each `misalign` bytes past a page.
struct HostTensors {
  HostTensors(const KvLayout& layout, std::uint64_t misalign) : layout(layout) {
    for (std::uint64_t bytes : layout.tensor_bytes)
      memory.emplace_back(bytes + 4096 + misalign, std::byte{0});
    for (auto& m : memory) {
      const auto at = reinterpret_cast<std::uintptr_t>(m.data());
      base.push_back(m.data() + ((4096 - at % 4096) % 4096) + misalign);
    }
  }
  void fill(std::uint64_t seed) {
    for (std::size_t t = 0; t < base.size(); ++t) {
      const auto bytes = random_bytes(layout.tensor_bytes[t], seed * 131 + t);
      std::memcpy(base[t], bytes.data(), bytes.size());
    }
  }
  std::vector<KVPiece> pieces(std::size_t block) {
    std::vector<KVPiece> out;
    for (const PieceAt& p : layout.blocks[block])
      out.push_back({base[p.tensor] + p.offset, p.size});
    return out;
  }
  // Block b's bytes back to back.
  std::vector<std::byte> block_bytes(std::size_t block) const {
    std::vector<std::byte> out;
    for (const PieceAt& p : layout.blocks[block])
      out.insert(out.end(), base[p.tensor] + p.offset, base[p.tensor] + p.offset + p.size);
    return out;
  }
  const KvLayout& layout;
  std::vector<std::vector<std::byte>> memory;
  std::vector<std::byte*> base;
};

const std::vector<std::size_t> kBlocks = {3, 0, 5, 1};  // not in page order

std::vector<KVResult> run(KVStore& store, bool put, bool async, const std::vector<KVKey>& keys,
                          const KVBlockList& blocks) {
  if (async) {
    KVTicket t = put ? store.put_async(keys, blocks) : store.get_async(keys, blocks);
    t.wait();
    return t.results();
  }
  std::vector<KVBlock> views(blocks.begin(), blocks.end());
  return put ? store.put(keys, views) : store.get(keys, views);
}

void round_trip(const KvLayout& layout, std::uint64_t misalign, bool async) {
  SCOPED_TRACE(layout.name + " misaligned by " + std::to_string(misalign) +
               (async ? ", async" : ", sync"));
  TempDir dir;
  const std::uint64_t block = layout.block_bytes();
  auto store = KVStore::open(dir.path(), kv_namespace(layout.name),
                             16 * ((block + 4095) / 4096 * 4096), block);
  HostTensors source(layout, misalign), target(layout, misalign);
  source.fill(7);
  std::vector<KVKey> keys;
  KVBlockList from, to;
  for (std::size_t b : kBlocks) {
    keys.push_back(1000 + b);
    from.push_back(source.pieces(b));
    to.push_back(target.pieces(b));
  }
  for (const KVResult& r : run(store, true, async, keys, from)) ASSERT_TRUE(r.ok()) << r.message;
  for (const KVResult& r : run(store, false, async, keys, to)) ASSERT_TRUE(r.ok()) << r.message;
  for (std::size_t b : kBlocks) ASSERT_EQ(target.block_bytes(b), source.block_bytes(b)) << b;
  // Nothing outside the blocks' pieces was written: blocks 2 and 4 are still zero.
  for (std::size_t b : {2, 4})
    ASSERT_EQ(target.block_bytes(b), std::vector<std::byte>(block, std::byte{0})) << b;

  // The same blocks read into one contiguous buffer each: the pieces back to back.
  std::vector<std::vector<std::byte>> whole(kBlocks.size(), std::vector<std::byte>(block));
  KVBlockList flat;
  for (auto& w : whole) flat.push_back({{w.data(), w.size()}});
  for (const KVResult& r : run(store, false, async, keys, flat)) ASSERT_TRUE(r.ok()) << r.message;
  for (std::size_t i = 0; i < kBlocks.size(); ++i)
    ASSERT_EQ(whole[i], source.block_bytes(kBlocks[i]));

  // And the other way: contiguous blocks put, read into the layout's pieces.
  std::vector<KVKey> flat_keys;
  for (std::size_t i = 0; i < kBlocks.size(); ++i) {
    flat_keys.push_back(2000 + i);
    const auto bytes = random_bytes(block, 99 + i);
    std::memcpy(whole[i].data(), bytes.data(), block);  // `flat` points into it
  }
  for (const KVResult& r : run(store, true, async, flat_keys, flat))
    ASSERT_TRUE(r.ok()) << r.message;
  HostTensors back(layout, misalign);
  KVBlockList into;
  for (std::size_t b : kBlocks) into.push_back(back.pieces(b));
  for (const KVResult& r : run(store, false, async, flat_keys, into))
    ASSERT_TRUE(r.ok()) << r.message;
  for (std::size_t i = 0; i < kBlocks.size(); ++i)
    ASSERT_EQ(back.block_bytes(kBlocks[i]), whole[i]);
}

TEST(KvLayouts, EveryEngineLayoutRoundTripsBitExact) {
  // Page-aligned tensors with synchronous calls, misaligned ones with asynchronous (each layout
  // both ways, in the time CI has).
  for (const KvLayout& layout : test_layouts(6)) {
    ASSERT_NO_FATAL_FAILURE(round_trip(layout, 0, false));
    ASSERT_NO_FATAL_FAILURE(round_trip(layout, 64, true));
  }
}

TEST(KvLayouts, BadPiecesGetClearErrors) {
  const KvLayout layout = vllm_layout(4, 3, 16, 8, 128, 2);  // 8 pieces of 32 KiB
  const std::uint64_t block = layout.block_bytes();
  TempDir dir;
  auto store = KVStore::open(dir.path(), kv_namespace(), 8 * block, block);
  HostTensors t(layout, 0);
  t.fill(3);
  std::vector<KVPiece> good = t.pieces(0);
  KVKey key = 7;
  ASSERT_TRUE(store.put(std::span(&key, 1), std::vector<KVBlock>{good})[0].ok());

  // Pieces that do not add up to the stored block.
  std::vector<KVPiece> short_by_one = good;
  short_by_one.pop_back();
  KVResult r = store.get(std::span(&key, 1), std::vector<KVBlock>{short_by_one})[0];
  EXPECT_EQ(r.status, KVStatus::bad_size);
  EXPECT_NE(r.message.find("destination of"), std::string::npos) << r.message;
  // More than a block.
  std::vector<std::byte> extra(4096);
  std::vector<KVPiece> too_long = good;
  too_long.push_back({extra.data(), extra.size()});
  KVKey other = 8;
  r = store.put(std::span(&other, 1), std::vector<KVBlock>{too_long})[0];
  EXPECT_EQ(r.status, KVStatus::bad_size) << r.message;

  // Overlapping pieces: a get would write bytes twice; a put is refused the same way.
  std::vector<KVPiece> overlapping = good;
  overlapping[5].data = static_cast<std::byte*>(overlapping[2].data) + 4096;
  r = store.get(std::span(&key, 1), std::vector<KVBlock>{overlapping})[0];
  EXPECT_EQ(r.status, KVStatus::unsupported);
  EXPECT_NE(r.message.find("pieces 2 and 5 overlap"), std::string::npos) << r.message;
  r = store.put(std::span(&other, 1), std::vector<KVBlock>{overlapping})[0];
  EXPECT_EQ(r.status, KVStatus::unsupported);
  EXPECT_NE(r.message.find("overlap"), std::string::npos) << r.message;
  // In address order too (the check skips its sort there): the first runs into the second.
  std::vector<std::byte> run(3 * 4096);
  const std::vector<KVPiece> in_order_overlap = {{run.data(), 2 * 4096},
                                                 {run.data() + 4096, 2 * 4096}};
  r = store.put(std::span(&other, 1), std::vector<KVBlock>{in_order_overlap})[0];
  EXPECT_EQ(r.status, KVStatus::unsupported);
  EXPECT_NE(r.message.find("pieces 0 and 1 overlap"), std::string::npos) << r.message;
  // The stored block is untouched by the refusals.
  std::vector<std::byte> whole(block);
  ASSERT_TRUE(get_one(store, key, whole).ok());
  EXPECT_EQ(whole, t.block_bytes(0));

  // A piece on a GPU where none is usable (GPU machines: tests/test_gpu_kv_layouts.cpp checks
  // pieces on two GPUs).
  if (!cuda_available()) {
    std::vector<KVPiece> on_gpu = good;
    on_gpu[1].device = Device::cuda(0);
    r = store.get(std::span(&key, 1), std::vector<KVBlock>{on_gpu})[0];
    EXPECT_EQ(r.status, KVStatus::unsupported);
    EXPECT_NE(r.message.find("no GPU is usable"), std::string::npos) << r.message;
  }
}

}  // namespace
}  // namespace ferry::test
