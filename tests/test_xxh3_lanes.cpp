// The lane split of XXH3 (src/cuda/xxh3_lanes.hpp, the GPU checksum kernel's arithmetic), run on
// the host: every length class and alignment gives libxxhash's XXH3_64bits.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include "cuda/xxh3_lanes.hpp"

namespace {

using namespace ferry::xxh3;

std::uint64_t lanes_digest(const unsigned char* in, std::uint64_t len) {
  static const Keys keys = make_keys(XXH3_kSecret);
  if (len <= kMidSizeMax) return hash_short(in, len, keys);
  std::uint64_t acc[kLanes];
  for (unsigned lane = 0; lane < kLanes; ++lane)
    acc[lane] = lane_accumulator(in, len, lane, keys,
                                 [in](std::uint64_t at) { return load64(in + at); });
  return merge(acc, len, keys);
}

std::vector<unsigned char> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

TEST(Xxh3Lanes, EveryLengthUpToFourBlocksMatchesTheLibrary) {
  const auto data = random_bytes(4 * kBlockBytes + 70, 1);
  for (std::uint64_t len = 0; len <= data.size(); ++len)
    ASSERT_EQ(lanes_digest(data.data(), len), XXH3_64bits(data.data(), len)) << len << " bytes";
}

TEST(Xxh3Lanes, BlockSizesOfTheKvStoreMatchTheLibrary) {
  const auto data = random_bytes((4u << 20) + 4096, 2);
  for (std::uint64_t len : {4096ull, 65536ull, 65535ull, 65537ull, 262144ull, 1048576ull,
                            1048576ull + 63, 4194304ull, 4194304ull + 4095})
    ASSERT_EQ(lanes_digest(data.data(), len), XXH3_64bits(data.data(), len)) << len << " bytes";
}

TEST(Xxh3Lanes, UnalignedStartsMatchTheLibrary) {
  const auto data = random_bytes(3 * kBlockBytes + 200, 3);
  for (std::uint64_t start = 1; start < 16; ++start)
    for (std::uint64_t len : {1ull, 17ull, 129ull, 241ull, 1025ull, 2048ull, 3000ull})
      ASSERT_EQ(lanes_digest(data.data() + start, len), XXH3_64bits(data.data() + start, len))
          << len << " bytes at +" << start;
}

TEST(Xxh3Lanes, ConstantInputsMatchTheLibrary) {
  for (unsigned char fill : {0x00, 0xFF, 0x5A}) {
    const std::vector<unsigned char> data(20000, fill);
    for (std::uint64_t len : {0ull, 3ull, 8ull, 16ull, 128ull, 240ull, 241ull, 20000ull})
      ASSERT_EQ(lanes_digest(data.data(), len), XXH3_64bits(data.data(), len))
          << len << " bytes of " << int(fill);
  }
}

}  // namespace
