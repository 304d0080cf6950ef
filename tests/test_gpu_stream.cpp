// Weight streaming into GPU slots: every group's bytes are in its slot when the compute stream
// reads them after wait() (host arena and file sources, several passes, prefetch 1 to 3), a slot
// is never refilled under a read still queued, and the expert cache's hits and misses land the
// right experts. Reads go on the compute stream
// itself, so they are ordered exactly as a kernel would be. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstring>

#include "cuda/cuda_resources.hpp"
#include "ferry/expert_cache.hpp"
#include "ferry/weight_stream.hpp"
#include "shim/cuda_driver.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

using test::TempDir;

class GpuStream : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available())
      GTEST_SKIP() << "no usable GPU: " << shim::CudaDriver::get().why_unusable;
    detail::device_context(0).make_current();
    compute = std::make_unique<detail::Stream>();
  }
  // The device bytes at `address`, read on the compute stream (after what it waits for).
  std::vector<std::byte> read(std::uintptr_t address, std::uint64_t size) {
    std::vector<std::byte> out(size);
    FERRY_CU(cuMemcpyDtoHAsync, out.data(), address, size, compute->get());
    compute->synchronize();
    return out;
  }
  void* stream() { return compute->get(); }
  std::unique_ptr<detail::Stream> compute;
};

struct Groups {
  std::vector<std::vector<std::vector<std::byte>>> bytes;
  std::vector<StreamGroup> groups;
};

Groups make_groups(std::size_t count, std::vector<std::uint64_t> sizes) {
  Groups out;
  for (std::size_t g = 0; g < count; ++g) {
    out.bytes.emplace_back();
    for (std::size_t t = 0; t < sizes.size(); ++t)
      out.bytes[g].push_back(test::random_bytes(sizes[t], g * 100 + t + 7));
  }
  for (std::size_t g = 0; g < count; ++g) {
    StreamGroup group;
    for (const auto& b : out.bytes[g]) group.tensors.push_back({b.size(), b.data()});
    out.groups.push_back(group);
  }
  return out;
}

TEST_F(GpuStream, HostSourceEveryPass) {
  for (unsigned prefetch : {1u, 2u, 3u}) {
    auto host = make_groups(7, {(3 << 20) + 5, 4096, 1000});
    StreamOptions options;
    options.device = Device::cuda(0);
    WeightStream ws(host.groups, prefetch, options);
    ws.prime(stream());
    for (int pass = 0; pass < 3; ++pass)
      for (std::size_t g = 0; g < 7; ++g) {
        ws.wait(g, stream());
        for (std::size_t t = 0; t < 3; ++t)
          ASSERT_EQ(read(ws.tensor_address(g, t), host.bytes[g][t].size()), host.bytes[g][t])
              << "prefetch " << prefetch << " pass " << pass << " group " << g;
        ws.release(g, stream());
      }
    EXPECT_EQ(ws.stats().demand_fills, 0u);
  }
}

// Prefetch 1: one slot for every group. Eight 64 MiB reads of group 0 are queued on the compute
// stream (into pinned memory: asynchronous, on another copy engine than the fill's), then
// release(0) refills the slot with group 1. The fill must wait for every read: were it not
// ordered after them, the later reads would see group 1's bytes.
TEST_F(GpuStream, ASlotIsNotRefilledWhileTheComputeStreamStillReadsIt) {
  constexpr std::uint64_t kBytes = 64ull << 20;
  auto host = make_groups(3, {kBytes});
  StreamOptions options;
  options.device = Device::cuda(0);
  WeightStream ws(host.groups, 1, options);
  ws.prime(stream());
  ws.wait(0, stream());
  std::vector<detail::HostBuffer> reads;
  for (int i = 0; i < 8; ++i) {
    reads.emplace_back(kBytes, &detail::device_context(0));
    FERRY_CU(cuMemcpyDtoHAsync, reads.back().data(), ws.tensor_address(0, 0), kBytes,
             compute->get());
  }
  ws.release(0, stream());
  ws.wait(1, stream());
  const auto after = read(ws.tensor_address(1, 0), kBytes);
  for (const auto& r : reads)
    ASSERT_EQ(std::memcmp(r.data(), host.bytes[0][0].data(), kBytes), 0)
        << "the slot was refilled under a read";
  ASSERT_EQ(after, host.bytes[1][0]);
}

TEST_F(GpuStream, FilesSourceEveryPass) {
  TempDir dir;
  auto host = make_groups(5, {(2 << 20) + 3, 777});
  std::string data;
  for (std::size_t g = 0; g < 5; ++g)
    for (std::size_t t = 0; t < 2; ++t) {
      host.groups[g].tensors[t].host = nullptr;
      host.groups[g].tensors[t].file_offset = data.size();
      data.append(reinterpret_cast<const char*>(host.bytes[g][t].data()), host.bytes[g][t].size());
    }
  test::write_file(dir / "w.bin", data);
  auto files = FileSet::create();
  files->add(dir / "w.bin");
  for (IoMode io : {IoMode::Direct, IoMode::Buffered}) {
    StreamOptions options;
    options.device = Device::cuda(0);
    options.source = StreamSource::Files;
    options.files = files;
    options.transfer.io = io;
    WeightStream ws(host.groups, 2, options);
    ws.prime(stream());
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t g = 0; g < 5; ++g) {
        ws.wait(g, stream());
        for (std::size_t t = 0; t < 2; ++t)
          ASSERT_EQ(read(ws.tensor_address(g, t), host.bytes[g][t].size()), host.bytes[g][t]);
        ws.release(g, stream());
      }
  }
}

TEST_F(GpuStream, ExpertCacheLandsTheAskedExperts) {
  auto host = make_groups(8, {65536, 300});
  StreamOptions options;
  options.device = Device::cuda(0);
  ExpertCache cache(host.groups, 3, options);
  const std::size_t trace[][2] = {{0, 1}, {1, 2}, {5, 0}, {7, 6}, {0, 7}, {3, 4}};
  for (const auto& step : trace) {
    const std::size_t guess[] = {(step[0] + 1) % 8};
    const auto slots = cache.acquire(step, stream(), guess);
    for (std::size_t i = 0; i < 2; ++i) {
      ASSERT_EQ(read(cache.slot_address(slots[i]), 65536), host.bytes[step[i]][0]);
      ASSERT_EQ(read(cache.slot_address(slots[i]) + 65536, 300), host.bytes[step[i]][1]);
    }
    cache.release(step);
  }
  EXPECT_GT(cache.stats().hits, 0u);
}

}  // namespace
}  // namespace ferry
