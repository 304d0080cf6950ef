// paged_blocks (include/ferry/kv_pages.hpp): a batch's pieces from per-layer geometry. Each
// block's pieces are its row of every layer in layer order; bad geometry and rows past a layer
// are refused naming the layer or block; a store round trip through it is bit-exact and leaves
// the bytes between rows (a stride wider than the row) untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "ferry/kv_pages.hpp"
#include "kv_test_support.hpp"

namespace ferry::test {
namespace {

// Two layers of different row sizes, the second with 64 bytes of padding after each row.
struct Paged {
  static constexpr std::uint64_t kRows = 6, kRow0 = 4096, kRow1 = 2048, kStride1 = 2048 + 64;
  std::vector<std::byte> layer0 = std::vector<std::byte>(kRows * kRow0);
  std::vector<std::byte> layer1 = std::vector<std::byte>(kRows * kStride1);
  std::vector<KVPagedLayer> layers() {
    return {{layer0.data(), kRow0, kRow0, kRows}, {layer1.data(), kRow1, kStride1, kRows}};
  }
};

std::string refusal(std::span<const KVPagedLayer> layers, std::span<const std::uint64_t> rows) {
  try {
    paged_blocks(layers, rows);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "accepted";
}

TEST(KvPages, EachBlockIsItsRowOfEveryLayerInOrder) {
  Paged p;
  const auto layers = p.layers();
  const std::vector<std::uint64_t> rows = {4, 0, 5};
  const KVBlockList blocks = paged_blocks(layers, rows);
  ASSERT_EQ(blocks.size(), 3u);
  for (std::size_t b = 0; b < rows.size(); ++b) {
    ASSERT_EQ(blocks[b].size(), 2u);
    EXPECT_EQ(blocks[b][0].data, p.layer0.data() + rows[b] * Paged::kRow0);
    EXPECT_EQ(blocks[b][0].size, Paged::kRow0);
    EXPECT_EQ(blocks[b][1].data, p.layer1.data() + rows[b] * Paged::kStride1);
    EXPECT_EQ(blocks[b][1].size, Paged::kRow1);
    EXPECT_EQ(blocks[b][1].device, Device::cpu());
  }
}

TEST(KvPages, BadGeometryAndRowsPastALayerAreRefusedByName) {
  Paged p;
  auto layers = p.layers();
  const std::vector<std::uint64_t> past = {1, 6};
  EXPECT_EQ(refusal(layers, past), "KV block 1: row 6 is past paged layer 0's 6 rows");
  EXPECT_EQ(refusal({}, past), "KV paged blocks need at least one layer");
  const std::vector<std::uint64_t> one = {0};
  layers[1].row_stride = Paged::kRow1 - 1;
  EXPECT_EQ(refusal(layers, one), "KV paged layer 1: rows of 2048 bytes overlap (stride 2047)");
  layers = p.layers();
  layers[0].rows = 0;
  EXPECT_EQ(refusal(layers, one), "KV paged layer 0 has no rows");
  layers = p.layers();
  layers[1].row_bytes = 0;
  EXPECT_EQ(refusal(layers, one), "KV paged layer 1: rows of 0 bytes");
  layers = p.layers();
  layers[0].base = nullptr;
  EXPECT_EQ(refusal(layers, one), "KV paged layer 0 has no memory");
}

TEST(KvPages, StoreRoundTripIsBitExactAndLeavesThePaddingAlone) {
  TempDir dir;
  const std::uint64_t block = Paged::kRow0 + Paged::kRow1;
  auto store = KVStore::open(dir.path(), kv_namespace(), 16 * 8192, block);
  Paged source, target;
  source.layer0 = random_bytes(source.layer0.size(), 1);
  source.layer1 = random_bytes(source.layer1.size(), 2);
  const std::byte pad{0x5a};
  std::fill(target.layer1.begin(), target.layer1.end(), pad);
  const std::vector<std::uint64_t> rows = {3, 1, 4};
  const std::vector<KVKey> keys = {30, 10, 40};
  const KVBlockList from = paged_blocks(source.layers(), rows);
  const KVBlockList to = paged_blocks(target.layers(), rows);
  for (const KVResult& r : store.put(keys, std::vector<KVBlock>(from.begin(), from.end())))
    ASSERT_TRUE(r.ok()) << r.message;
  KVTicket ticket = store.get_async(keys, to);
  ticket.wait();
  for (const KVResult& r : ticket.results()) ASSERT_TRUE(r.ok()) << r.message;
  for (std::uint64_t row = 0; row < Paged::kRows; ++row) {
    const bool moved = row == 1 || row == 3 || row == 4;
    const auto* s0 = source.layer0.data() + row * Paged::kRow0;
    const auto* t0 = target.layer0.data() + row * Paged::kRow0;
    EXPECT_EQ(moved, std::equal(s0, s0 + Paged::kRow0, t0)) << row;
    const auto* s1 = source.layer1.data() + row * Paged::kStride1;
    const auto* t1 = target.layer1.data() + row * Paged::kStride1;
    EXPECT_EQ(moved, std::equal(s1, s1 + Paged::kRow1, t1)) << row;
    for (std::uint64_t i = Paged::kRow1; i < Paged::kStride1; ++i) ASSERT_EQ(t1[i], pad) << row;
  }
}

}  // namespace
}  // namespace ferry::test
