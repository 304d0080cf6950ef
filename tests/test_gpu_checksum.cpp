// The GPU checksum kernel (src/cuda/gpu_checksum.cpp) against libxxhash on the same bytes: many
// blocks per call, every length class, aligned and not. Skips without a GPU or a kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include "cuda/cuda_resources.hpp"
#include "cuda/gpu_checksum.hpp"
#include "ferry/error.hpp"
#include "shim/cuda_driver.hpp"

namespace ferry::detail {
namespace {

class GpuChecksum : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!shim::CudaDriver::get().usable)
      GTEST_SKIP() << "no usable GPU: " << shim::CudaDriver::get().why_unusable;
    if (const std::string why = gpu_checksum_unavailable(0); !why.empty()) GTEST_SKIP() << why;
  }
};

std::vector<unsigned char> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

// Copies `host` to the GPU and checks the digests of (offset, length) ranges of it.
void check(const std::vector<unsigned char>& host,
           const std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges) {
  device_context(0).make_current();
  auto memory = allocate_device_memory(std::make_shared<PrimaryContext>(0), host.size());
  const auto base = reinterpret_cast<shim::cu::DevicePtr>(memory.get());
  Stream stream;
  FERRY_CU(cuMemcpyHtoDAsync, base, host.data(), host.size(), stream.get());
  std::vector<DeviceBytes> on_gpu;
  for (const auto& [offset, length] : ranges) on_gpu.push_back({base + offset, length});
  const std::vector<std::uint64_t> got = gpu_checksums(0, on_gpu, stream.get());
  ASSERT_EQ(got.size(), ranges.size());
  for (std::size_t i = 0; i < ranges.size(); ++i)
    ASSERT_EQ(got[i], XXH3_64bits(host.data() + ranges[i].first, ranges[i].second))
        << ranges[i].second << " bytes at +" << ranges[i].first;
}

TEST_F(GpuChecksum, EveryShortLengthAndBlockEdgeMatchesTheLibrary) {
  const auto host = random_bytes(8192, 11);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (std::uint64_t len = 0; len <= 2100; ++len) ranges.push_back({0, len});
  for (std::uint64_t start = 1; start < 9; ++start)  // unaligned starts take the bytewise loads
    for (std::uint64_t len : {5ull, 100ull, 241ull, 1024ull, 1025ull, 4096ull})
      ranges.push_back({start, len});
  check(host, ranges);
}

TEST_F(GpuChecksum, ManyKvSizedBlocksInOneCallMatchTheLibrary) {
  const std::uint64_t block = 1 << 20;
  const auto host = random_bytes(64 * block, 12);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (std::uint64_t b = 0; b < 64; ++b) ranges.push_back({b * block, block - (b % 3) * 4096});
  ranges.push_back({0, 64 * block});  // one long block beside the others
  check(host, ranges);
}

// A few large inputs share the GPU's threads by segments of 1 KiB blocks: each alignment class
// of loads (16, 8, and 1 byte), with short inputs (no segments at all) between them.
TEST_F(GpuChecksum, FewLargeBlocksAtEveryAlignmentMatchTheLibrary) {
  const std::uint64_t mib = 1 << 20;
  const auto host = random_bytes(40 * mib, 13);
  check(host, {{0, 16 * mib},
               {16 * mib, 0},
               {16 * mib + 8, 8 * mib + 3},
               {3, 100},
               {25 * mib + 1, 4 * mib},
               {30 * mib + 4, 2 * mib + 100},
               {33 * mib, 241},
               {34 * mib, 1025},
               {35 * mib + 16, 5 * mib - 16},
               {7, 5}});
}

// Copies queued after the checksums (queue_gpu_checksums, which waits for nothing) are made only
// for ranges whose digest matched what was expected: aligned ones, ones neither start nor length aligned, ones of several slices.
TEST_F(GpuChecksum, CopiesAreMadeOnlyWhereTheDigestMatched) {
  const std::uint64_t kib = 1024;
  const auto host = random_bytes(1024 * kib, 14);
  device_context(0).make_current();
  auto context = std::make_shared<PrimaryContext>(0);
  auto source = allocate_device_memory(context, host.size());
  auto target = allocate_device_memory(context, host.size());
  const auto from = reinterpret_cast<shim::cu::DevicePtr>(source.get());
  const auto to = reinterpret_cast<shim::cu::DevicePtr>(target.get());
  Stream stream;
  FERRY_CU(cuMemcpyHtoDAsync, from, host.data(), host.size(), stream.get());
  FERRY_CU(cuMemsetD8Async, to, 0, host.size(), stream.get());
  // Range 0 (the first 512 KiB) matches, range 1 (the rest) is expected to be something else.
  const std::vector<DeviceBytes> ranges = {{from, 512 * kib}, {from + 512 * kib, 512 * kib}};
  const std::vector<std::uint64_t> expected = {XXH3_64bits(host.data(), 512 * kib), 42};
  const std::vector<MatchedCopy> copies = {
      {from, to, 64 * kib, 0},                                    // aligned, one slice
      {from + 64 * kib + 3, to + 64 * kib + 5, 200 * kib + 7, 0},  // unaligned, four slices
      {from + 512 * kib, to + 512 * kib, 256 * kib, 1},            // its range did not match
  };
  bool queued = false;
  GpuChecksumScratch scratch;
  HostBuffer pinned(2 * sizeof(std::uint64_t), &device_context(0));
  auto* got = reinterpret_cast<std::uint64_t*>(pinned.data());
  queue_gpu_checksums(0, ranges, stream.get(), scratch, got, expected, copies,
                      [&] { queued = true; });
  stream.synchronize();
  EXPECT_TRUE(queued);
  ASSERT_EQ(got[0], expected[0]);
  ASSERT_NE(got[1], expected[1]);
  std::vector<unsigned char> back(host.size());
  FERRY_CU(cuMemcpyDtoH, back.data(), to, back.size());
  std::vector<unsigned char> want(host.size(), 0);
  std::copy_n(host.begin(), 64 * kib, want.begin());
  std::copy_n(host.begin() + 64 * kib + 3, 200 * kib + 7, want.begin() + 64 * kib + 5);
  EXPECT_TRUE(back == want) << "the matched copies landed, and nothing else";
}

TEST_F(GpuChecksum, NoRangesIsNoDigests) {
  Stream stream;
  EXPECT_TRUE(gpu_checksums(0, {}, stream.get()).empty());
}

}  // namespace
}  // namespace ferry::detail
